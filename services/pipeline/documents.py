"""PDFs from clients (`file` parts): checked before any page is rendered, then each page an image
that renders on first use (after admission), through the tile policy and the encoder's feature
cache like any image.

Checked: the bytes (`max_pdf_bytes`); PDFium opens it (a damaged file, or an encrypted one — no
password is taken — is a 400); the page count (`max_pdf_pages`); each page's size from its
dictionary. Pages render at RENDER_DPI, scaled down so the long side is at most `max_pdf_page_px`:
a page declared 200 inches wide costs what any page does. PDFium is not thread-safe: every call
into it holds one lock.
"""

from __future__ import annotations

import hashlib
import threading

import numpy as np

from services.common.errors import bad_request, too_large
from services.models.profile import LimitsSpec
from services.pipeline import media
from services.pipeline.turn import DocumentInput, ImageInput

RENDER_DPI = 108  # 1.5x PDF's 72 points an inch: body text stays legible to a vision encoder
_PDFIUM = threading.Lock()


def file_data(value: object, limits: LimitsSpec, *, param: str) -> bytes:
    """OpenAI's `file_data`: a data: URL or bare base64."""
    if not isinstance(value, str):
        raise bad_request("file part needs file.file_data (a PDF, base64)", param=param)
    if value.startswith("data:"):
        return media.data_url_bytes(value, param=param, limit=limits.max_pdf_bytes, what="file")
    if len(value) * 3 // 4 > limits.max_pdf_bytes:
        raise too_large(
            f"file is larger than {limits.max_pdf_bytes} bytes", code="file_too_large", param=param
        )
    return media.b64decode(value, param=param)


def pdf_document(data: bytes, limits: LimitsSpec, *, param: str) -> DocumentInput:
    import pypdfium2 as pdfium

    if len(data) > limits.max_pdf_bytes:
        raise too_large(
            f"file is larger than {limits.max_pdf_bytes} bytes", code="file_too_large", param=param
        )
    if not data.startswith(b"%PDF-"):
        raise bad_request("file is not a PDF (the only file type accepted)", code="invalid_file", param=param)
    with _PDFIUM:
        try:
            doc = pdfium.PdfDocument(data)
        except pdfium.PdfiumError as e:
            if "password" in str(e).lower():
                raise bad_request(
                    "the PDF is encrypted; send it without a password", code="encrypted_pdf", param=param
                ) from None
            raise bad_request(
                "the PDF could not be read: it is damaged", code="invalid_file", param=param
            ) from None
        pages = len(doc)
        if pages == 0:
            raise bad_request("the PDF has no pages", code="invalid_file", param=param)
        if pages > limits.max_pdf_pages:
            raise too_large(
                f"the PDF has {pages} pages; the limit is {limits.max_pdf_pages}",
                code="file_too_large",
                param=param,
            )
        sizes = [doc.get_page_size(i) for i in range(pages)]
    digest = hashlib.sha256(data).hexdigest()
    images = []
    for i, (w_pt, h_pt) in enumerate(sizes):
        if not (w_pt > 0 and h_pt > 0):
            raise bad_request(f"page {i + 1} of the PDF has no size", code="invalid_file", param=param)
        scale = min(RENDER_DPI / 72, limits.max_pdf_page_px / max(w_pt, h_pt))
        width, height = max(1, round(w_pt * scale)), max(1, round(h_pt * scale))
        images.append(
            ImageInput(
                width=width,
                height=height,
                detail="auto",
                content_hash=f"{digest}:page:{i}",
                decode=lambda i=i, scale=scale: _render(doc, i, scale, param),
            )
        )
    return DocumentInput(pages=tuple(images))


def _render(doc, index: int, scale: float, param: str) -> np.ndarray:
    import pypdfium2 as pdfium

    with _PDFIUM:
        try:
            page = doc[index]
            try:
                image = page.render(scale=scale).to_pil()
            finally:
                page.close()
        except pdfium.PdfiumError:
            raise bad_request(
                f"page {index + 1} of the PDF could not be rendered", code="invalid_file", param=param
            ) from None
    return np.asarray(image.convert("RGB"))
