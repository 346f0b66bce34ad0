"""The size a frame reaches the encoder at: aspect ratio kept, the long side at most `frame_px`,
both sides rounded to multiples of `multiple` (the vision encoder's patch grid: Qwen3-Omni's 16 px
patches merged 2x2 need 32 px cells), never below one cell."""

from __future__ import annotations


def frame_size(width: int, height: int, frame_px: int, multiple: int) -> tuple[int, int]:
    if width < 1 or height < 1:
        raise ValueError(f"frame size {width}x{height}")
    scale = min(1.0, frame_px / max(width, height))

    def side(x: int) -> int:
        return max(multiple, round(x * scale / multiple) * multiple)

    return side(width), side(height)
