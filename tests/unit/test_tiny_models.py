"""The tiny models: shapes, determinism, and chunked vocoding equal to whole-utterance decoding."""

import numpy as np
from PIL import Image

from services.models.profile import load_profile
from services.pipeline.vocoder_window import VocoderWindow
from tests.conftest import load_adapter

PROFILE = load_profile("tiny")


def test_vision_encoder_gives_64_embeddings_per_tile():
    from omni.v1 import stages_pb2

    from services.stages.encoder import cut_tiles

    enc = load_adapter("tiny", "vision")
    grid = stages_pb2.TileGrid(cols=3, rows=2, tile_px=128)
    tiles = cut_tiles(Image.new("RGB", (300, 200)), grid)
    assert len(tiles) == 6 and all(t.size == (128, 128) for t in tiles)
    feats = enc.encode_tiles([enc.preprocess(t) for t in tiles])
    out = enc.assemble(feats, 3, 2)
    assert out.embeddings.shape == (6 * 64, 128) and out.tiles == 6
    # Batching does not change a tile's features.
    alone = enc.encode_tiles([enc.preprocess(tiles[0])])
    np.testing.assert_allclose(alone[0], feats[0], atol=1e-5)


def test_audio_encoder_rate():
    enc = load_adapter("tiny", "audio")
    (out,) = enc.encode([np.zeros(32000, np.float32)])
    assert out.embeddings.shape[1] == 128 and 48 <= out.embeddings.shape[0] <= 51
    assert out.audio_seconds == 2.0


def test_talker_is_deterministic_and_chunked():
    talker = load_adapter("tiny", "talker")
    a = list(talker.stream_units("Hello world.", "default"))
    b = list(talker.stream_units("Hello world.", "default"))
    assert all(np.array_equal(x, y) for x, y in zip(a, b, strict=True))
    assert sum(len(x) for x in a) == 2 * len("Hello world.")
    assert all(len(x) <= 25 for x in a)


def test_chunked_vocoding_equals_whole_utterance():
    voc = load_adapter("tiny", "vocoder")
    units = np.random.default_rng(0).integers(0, 256, 97).astype(np.int32)
    whole = voc.decode(units, None, None, "default")
    spec = load_profile("tiny").models.vocoder
    window = VocoderWindow(spec.context_frames, spec.lookahead_frames)
    calls = [window.push(units[k : k + 13]) for k in range(0, len(units), 13)] + [window.flush()]
    pieces = [voc.decode(c.units, c.left, c.right, "default") for c in calls if c]
    np.testing.assert_allclose(np.concatenate(pieces), whole, atol=1e-5)
    assert len(whole) == 97 * 480
