// omniray's voice console: talk to the served model over WebRTC (docs/webrtc.md).
// The API key typed here is sent once per call, to mint a one-use client secret, and not stored; the
// call itself carries only that secret. An application can instead hand the page a secret it minted,
// in the address: /console#client_secret=ek_... (used once, then taken out of the address).

const $ = (id) => document.getElementById(id);
const STATS_EVERY_MS = 500;
const LOG_LINES = 200;

const call = { pc: null, dc: null, mic: null, statsTimer: null };
const turns = [];            // {n, stoppedAt, responseId, ttfp, playedMs, status, jitter, concealed, stats0}
let playing = null;          // the turn whose answer is playing
let assistantLine = null;    // the transcript line being written
let typedAt = null;          // when a typed message asked for a response

function log(text, isError = false) {
  const li = document.createElement("li");
  li.textContent = `${new Date().toISOString().slice(11, 23)}  ${text}`;
  if (isError) li.className = "error";
  $("log").prepend(li);
  while ($("log").children.length > LOG_LINES) $("log").lastChild.remove();
}

function setStatus(text, state) {
  $("status").textContent = text;
  $("status").dataset.state = state;
}

async function loadModels() {
  const models = (await (await fetch("/v1/models")).json()).data;
  for (const m of models) $("model").add(new Option(m.id, m.id));
  for (const v of models[0]?.voices ?? []) $("voice").add(new Option(v, v));
}

async function clientSecret() {
  const fromUrl = new URLSearchParams(location.hash.slice(1)).get("client_secret");
  if (fromUrl) {
    history.replaceState(null, "", location.pathname);  // single use: not again, not in history
    return fromUrl;
  }
  const key = $("key").value.trim();
  const session = {
    type: "realtime",
    model: $("model").value,
    max_output_tokens: Number($("max-tokens").value) || 200,
    audio: {
      input: {
        turn_detection: { type: "server_vad", silence_duration_ms: 500 },
        ...($("transcribe").checked ? { transcription: { model: "whisper-1" } } : {}),
      },
      output: $("voice").value ? { voice: $("voice").value } : {},
    },
  };
  if ($("instructions").value.trim()) session.instructions = $("instructions").value.trim();
  const r = await fetch("/v1/realtime/client_secrets", {
    method: "POST",
    headers: { Authorization: `Bearer ${key}`, "Content-Type": "application/json" },
    body: JSON.stringify({ expires_after: { anchor: "created_at", seconds: 60 }, session }),
  });
  const body = await r.json();
  if (!r.ok) throw new Error(`client secret: ${body.error?.message ?? r.status}`);
  return body.value;
}

function gathered(pc) {
  // The server takes no trickled candidates: the offer goes with all of ours.
  if (pc.iceGatheringState === "complete") return Promise.resolve();
  return new Promise((resolve) => {
    pc.addEventListener("icegatheringstatechange", () => {
      if (pc.iceGatheringState === "complete") resolve();
    });
  });
}

async function connect() {
  $("connect").disabled = true;
  setStatus("connecting…", "idle");
  try {
    const secret = await clientSecret();
    call.mic = await navigator.mediaDevices.getUserMedia({
      audio: { echoCancellation: true, noiseSuppression: true, autoGainControl: true },
      // optional: the session keeps recent key frames for the next turn (docs/video.md)
      video: $("camera").checked ? { width: { ideal: 640 }, frameRate: { ideal: 5 } } : false,
    });
    const pc = (call.pc = new RTCPeerConnection({ iceServers: [] }));
    pc.ontrack = (e) => { $("speaker").srcObject = e.streams[0] ?? new MediaStream([e.track]); };
    pc.onconnectionstatechange = () => {
      if (["failed", "closed"].includes(pc.connectionState)) hangUp(`call ${pc.connectionState}`);
    };
    for (const track of call.mic.getTracks()) pc.addTrack(track, call.mic);
    call.dc = pc.createDataChannel("oai-events");
    call.dc.onmessage = (e) => onEvent(JSON.parse(e.data));
    call.dc.onclose = () => hangUp("events channel closed");
    await pc.setLocalDescription(await pc.createOffer());
    await gathered(pc);
    const r = await fetch(`/v1/realtime/calls?model=${encodeURIComponent($("model").value)}`, {
      method: "POST",
      headers: { Authorization: `Bearer ${secret}`, "Content-Type": "application/sdp" },
      body: pc.localDescription.sdp,
    });
    if (r.status !== 201) throw new Error(`call: ${(await r.json()).error?.message ?? r.status}`);
    await pc.setRemoteDescription({ type: "answer", sdp: await r.text() });
    call.statsTimer = setInterval(pollStats, STATS_EVERY_MS);
    $("hangup").disabled = false;
    for (const id of ["text", "image", "send"]) $(id).disabled = false;
  } catch (e) {
    setStatus(e.message, "error");
    log(e.message, true);
    hangUp();
  }
}

function hangUp(why) {
  clearInterval(call.statsTimer);
  call.pc?.close();
  call.mic?.getTracks().forEach((t) => t.stop());
  Object.assign(call, { pc: null, dc: null, mic: null, statsTimer: null });
  $("connect").disabled = false;
  $("hangup").disabled = true;
  for (const id of ["text", "image", "send"]) $(id).disabled = true;
  if (why) { setStatus(why, "idle"); log(why); }
}

function send(event) {
  call.dc?.readyState === "open" && call.dc.send(JSON.stringify(event));
}

// ---- the conversation -----------------------------------------------------------------------

function line(role, text) {
  const li = document.createElement("li");
  li.className = role;
  li.textContent = text;
  $("transcript").append(li);
  li.scrollIntoView({ block: "nearest" });
  return li;
}

function turnRow(turn) {
  let tr = document.querySelector(`tr[data-turn="${turn.n}"]`);
  if (!tr) {
    tr = document.createElement("tr");
    tr.dataset.turn = turn.n;
    $("turn-rows").prepend(tr);
  }
  const ms = (v) => (v == null ? "–" : `${Math.round(v)} ms`);
  tr.dataset.status = turn.status;
  if (turn.ttfp != null) tr.dataset.ttfp = Math.round(turn.ttfp);
  if (turn.playedMs != null) tr.dataset.played = Math.round(turn.playedMs);
  tr.innerHTML = "";
  for (const v of [turn.n, ms(turn.ttfp), ms(turn.playedMs), ms(turn.jitter),
                   turn.concealed == null ? "–" : `${turn.concealed.toFixed(1)} %`, turn.status]) {
    const td = document.createElement("td");
    td.textContent = v;
    tr.append(td);
  }
}

function turnOf(responseId) {
  return turns.find((t) => t.responseId === responseId);
}

function onEvent(ev) {
  if (ev.type !== "response.output_audio_transcript.delta") log(ev.type);
  switch (ev.type) {
    case "session.created":
      setStatus(`connected · ${ev.session.id}`, "connected");
      break;
    case "input_audio_buffer.speech_stopped":
      turns.push({ n: turns.length + 1, stoppedAt: performance.now(), status: "thinking" });
      turnRow(turns.at(-1));
      line("user", "(speech)").dataset.item = ev.item_id;
      break;
    case "conversation.item.done": {
      // a spoken turn's camera frames: how many joined it
      const frames = (ev.item.content ?? []).filter((c) => c.type === "input_image").length;
      const li = document.querySelector(`li[data-item="${CSS.escape(ev.item.id)}"]`);
      if (li && ev.item.role === "user" && frames) li.dataset.frames = String(frames);
      break;
    }
    case "conversation.item.input_audio_transcription.completed": {
      const li = document.querySelector(`li[data-item="${CSS.escape(ev.item_id)}"]`);
      if (li) li.textContent = ev.transcript;
      break;
    }
    case "response.created": {
      let turn = turns.at(-1);
      if (!turn || turn.responseId) {  // a typed message: its turn starts now
        turn = { n: turns.length + 1, stoppedAt: typedAt ?? performance.now() };
        turns.push(turn);
        typedAt = null;
      }
      Object.assign(turn, { responseId: ev.response.id, status: "in progress" });
      turnRow(turn);
      assistantLine = line("assistant", "");
      break;
    }
    case "response.output_audio_transcript.delta":
    case "response.output_text.delta":
      if (assistantLine) assistantLine.textContent += ev.delta;
      break;
    case "output_audio_buffer.started": {
      const turn = turnOf(ev.response_id);
      if (turn) {
        turn.ttfp = performance.now() - turn.stoppedAt;
        turn.startedAt = performance.now();
        turn.stats0 = null;
        playing = turn;
        turnRow(turn);
      }
      break;
    }
    case "output_audio_buffer.stopped":
    case "output_audio_buffer.cleared": {
      const turn = turnOf(ev.response_id);
      if (turn) {
        turn.playedMs ??= performance.now() - turn.startedAt;
        if (ev.type === "output_audio_buffer.cleared") turn.status = "cut";
        turnRow(turn);
      }
      if (playing === turn) playing = null;
      break;
    }
    case "conversation.item.truncated": {
      const turn = turns.find((t) => t.itemId === ev.item_id);
      if (turn) { turn.playedMs = ev.audio_end_ms; turn.status = "cut"; turnRow(turn); }
      document.querySelector(`li.assistant[data-item="${CSS.escape(ev.item_id)}"]`)?.classList.add("cut");
      break;
    }
    case "response.output_item.added":
      if (assistantLine) assistantLine.dataset.item = ev.item.id;
      if (turnOf(ev.response_id)) turnOf(ev.response_id).itemId = ev.item.id;
      break;
    case "response.done": {
      const turn = turnOf(ev.response.id);
      if (turn && turn.status !== "cut") { turn.status = ev.response.status; turnRow(turn); }
      break;
    }
    case "error":
      log(`error: ${ev.error.message}`, true);
      break;
  }
}

// The browser's receive statistics of the answer while it plays: jitter buffer delay and how much
// audio it had to conceal (stalls, losses).
async function pollStats() {
  if (!call.pc || !playing) return;
  let inbound = null;
  (await call.pc.getStats()).forEach((s) => { if (s.type === "inbound-rtp" && s.kind === "audio") inbound = s; });
  if (!inbound) return;
  const now = { delay: inbound.jitterBufferDelay ?? 0, emitted: inbound.jitterBufferEmittedCount ?? 0,
                concealed: inbound.concealedSamples ?? 0, total: inbound.totalSamplesReceived ?? 0 };
  const turn = playing;
  turn.stats0 ??= now;
  const emitted = now.emitted - turn.stats0.emitted, total = now.total - turn.stats0.total;
  if (emitted > 0) turn.jitter = ((now.delay - turn.stats0.delay) / emitted) * 1000;
  if (total > 0) turn.concealed = ((now.concealed - turn.stats0.concealed) / total) * 100;
  turnRow(turn);
}

// ---- typed messages and images --------------------------------------------------------------

const dataUrl = (file) => new Promise((resolve, reject) => {
  const reader = new FileReader();
  reader.onload = () => resolve(reader.result);
  reader.onerror = reject;
  reader.readAsDataURL(file);
});

// An event on the data channel is at most the server's max-message-size (256 KiB with aiortc): a
// picture goes as a JPEG no larger than MAX_IMAGE_SIDE px a side, its quality lowered until it fits.
const MAX_IMAGE_SIDE = 1024;
const MAX_IMAGE_URL = 240 * 1024;

async function fittedImage(file) {
  const img = new Image();
  img.src = await dataUrl(file);
  await img.decode();
  const scale = Math.min(1, MAX_IMAGE_SIDE / Math.max(img.width, img.height));
  const canvas = document.createElement("canvas");
  canvas.width = Math.round(img.width * scale);
  canvas.height = Math.round(img.height * scale);
  canvas.getContext("2d").drawImage(img, 0, 0, canvas.width, canvas.height);
  for (let quality = 0.9; quality > 0.2; quality -= 0.15) {
    const url = canvas.toDataURL("image/jpeg", quality);
    if (url.length <= MAX_IMAGE_URL) return url;
  }
  throw new Error("the image is too detailed to send; try a smaller one");
}

async function sendText(event) {
  event.preventDefault();
  const text = $("text").value.trim();
  const file = $("image").files[0];
  if (!text && !file) return;
  const content = text ? [{ type: "input_text", text }] : [];
  let url = null;
  if (file) {
    try {
      url = await fittedImage(file);
    } catch (e) {
      log(`image: ${e.message}`, true);
      return;
    }
    content.push({ type: "input_image", image_url: url });
  }
  const li = line("user", text);
  if (url) {
    const img = document.createElement("img");
    img.src = url;
    li.append(img);
  }
  send({ type: "conversation.item.create", item: { type: "message", role: "user", content } });
  if (text) {  // an image alone waits for the next question, typed or spoken
    typedAt = performance.now();
    send({ type: "response.create" });
  }
  $("text").value = "";
  $("image").value = "";
}

window.addEventListener("DOMContentLoaded", () => {
  loadModels().catch((e) => log(`models: ${e.message}`, true));
  $("connect").onclick = connect;
  $("hangup").onclick = () => hangUp("hung up");
  $("say").onsubmit = sendText;
});
