"""Reading request bodies after the route's token was checked: JSON into a schema (its
shape bounded before it is parsed, the parsing on a worker thread), and a bounded
multipart/form-data reader (parts kept in memory, every limit enforced as bytes arrive,
nothing spooled to disk, a body without its closing boundary refused).

Starlette's form parser spools file parts to temporary files and checks no file size, so a
huge upload reached /tmp before any limit applied. Here each file part may hold at most
``max_file_bytes`` and each text field ``max_field_bytes``; more parts, more files or
larger ones are refused at the byte that crosses the limit.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import python_multipart
from fastapi.exceptions import RequestValidationError
from pydantic import ValidationError
from python_multipart.exceptions import FormParserError
from python_multipart.multipart import MAX_BOUNDARY_LENGTH, MultipartState, parse_options_header
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request

from app import errors
from app.api.route_table import ServedRoute
from app.engine.host_memory import release_free_memory
from app.service.decode import TRIM_AFTER_BYTES, parse_label_text
from app.settings import LimitsSettings
from lad_client.routes import JSON


def validation_error(exc: ValidationError, prefix: str) -> RequestValidationError:
    """A pydantic error of a hand-read body, located under ``prefix`` like FastAPI's own."""
    items = []
    for err in exc.errors(include_url=False, include_context=False, include_input=False):
        item = dict(err)
        item["loc"] = (prefix, *err.get("loc", ()))
        items.append(item)
    return RequestValidationError(items)


def content_type(request: Request) -> str:
    return request.headers.get("content-type", "").split(";")[0].strip().lower()


def is_json(media_type: str) -> bool:
    return media_type == JSON or media_type.endswith("+json")


def accepted_media_type(request: Request, route: ServedRoute) -> str:
    """The body's media type when ``route`` accepts it (the table's ``content_types``,
    ``+json`` counted as JSON); else 415 ``unsupported_media_type`` naming them."""
    media_type = content_type(request)
    accepted = route.content_types
    if media_type in accepted or (JSON in accepted and is_json(media_type)):
        return media_type
    raise errors.UnsupportedMediaType(
        f"content type {errors.clip(media_type or '(none)')!r} is not supported; "
        f"send {' or '.join(accepted)}"
    )


MAX_JSON_STRINGS = 16_384
"""Most strings (keys and values) in one JSON body. The largest valid body, a calibration of
64 examples of 64 images with 64 labels, holds about 4,400."""
MAX_JSON_SKELETON_BYTES = 256 * 1024
"""Most bytes of a JSON body outside its strings (punctuation, numbers, literals, spaces);
a valid body, even pretty-printed, has a few tens of KiB there."""
MAX_JSON_DEPTH = 32
"""Deepest nesting of arrays and objects (our schemas nest four deep)."""

# A JSON string from its opening quote (possessive: linear even when unterminated).
_JSON_STRING = re.compile(rb'"[^"\\]*+(?:\\.[^"\\]*+)*+"', re.DOTALL)
_NOT_BRACKET = bytes(b for b in range(256) if b not in b"[]{}")
_AFTER_SPACE = re.compile(rb"[ \t\r\n]*:")


def check_json_shape(body: bytes) -> None:
    """Refuse a JSON body whose shape costs more than any valid one, before it is parsed.

    Parsing and validation cost grows with the number of keys and values, not with the
    bytes (a 36 MB body of 3 M unknown keys made pydantic build 3 M errors for 40 s). Here
    strings, bytes outside strings and depth are counted in one pass that stops at the
    first bound crossed: one step per string (``bytes.find`` crosses a string's bytes at
    memchr speed), so the work is bounded by the limits whatever the body holds.
    The same pass refuses a key repeated in one object: the parser would keep the last
    one, a proxy reading the first would see another request.
    """
    strings = skeleton = pos = 0
    objects: list[set[bytes] | None] = []  # per open bracket: an object's keys, or None
    while True:
        quote = body.find(b'"', pos)
        stop = len(body) if quote < 0 else quote
        skeleton += stop - pos
        if skeleton > MAX_JSON_SKELETON_BYTES:
            raise errors.InvalidRequest(
                f"the JSON body has more than {MAX_JSON_SKELETON_BYTES} bytes outside its strings"
            )
        for bracket in body[pos:stop].translate(None, _NOT_BRACKET):
            if bracket in b"[{":
                objects.append(set() if bracket == 0x7B else None)
                if len(objects) > MAX_JSON_DEPTH:
                    raise errors.InvalidRequest(
                        f"the JSON body nests deeper than {MAX_JSON_DEPTH} levels"
                    )
            elif objects:
                objects.pop()
        if quote < 0:
            return
        strings += 1
        if strings > MAX_JSON_STRINGS:
            raise errors.InvalidRequest(
                f"the JSON body has more than {MAX_JSON_STRINGS} strings (keys and values)"
            )
        close = body.find(b'"', quote + 1)
        if close > 0 and body[close - 1] == 0x5C:  # an escaped quote: read the escapes
            string = _JSON_STRING.match(body, quote)
            close = string.end() - 1 if string else -1
        if close < 0:
            return  # an unterminated string: parsing refuses it
        pos = close + 1
        if objects and objects[-1] is not None and _is_key(body, pos):
            _add_key(objects[-1], body[quote : close + 1])


def _is_key(body: bytes, after: int) -> bool:
    """Whether the string that ends before ``after`` is an object key (a colon follows)."""
    return _AFTER_SPACE.match(body, after) is not None


def _add_key(keys: set[bytes], key: bytes) -> None:
    """One more key of an object; a key seen before in it is refused. Escapes are read
    first ("\\u006dethod" is "method"), so no spelling of a key passes twice."""
    if b"\\" in key:
        try:
            key = json.loads(key).encode("utf-8", "surrogatepass")
        except ValueError:
            return  # an invalid escape: parsing refuses it
    else:
        key = key[1:-1]
    if key in keys:
        shown = errors.clip(key.decode("utf-8", "replace"))
        raise errors.InvalidRequest(
            f"the JSON body repeats the key {shown!r} in one object; send each key once "
            "(readers disagree on which one counts)"
        )
    keys.add(key)


def parse_json(body: bytes, model: Any) -> Any:
    """The body checked for shape, then parsed and validated (blocking: run it in a thread).
    After a large body, the free heap its chunks arrived in goes back to the OS."""
    try:
        check_json_shape(body)
        return model.model_validate_json(body)
    except ValidationError as exc:
        raise validation_error(exc, "body") from None
    finally:
        if len(body) >= TRIM_AFTER_BYTES:
            release_free_memory()


async def read_json(request: Request, route: ServedRoute) -> Any:
    """Read and validate the JSON body of ``route`` (its request model), of a content type
    it accepts (the body guard bounds its size and its time; the parsing runs on a worker
    thread, so the event loop keeps answering meanwhile)."""
    accepted_media_type(request, route)
    body = await request.body()
    return await run_in_threadpool(parse_json, body, route.request_model)


@dataclass
class Form:
    """The text fields (name -> values) and the file parts (name -> contents) of a form."""

    fields: dict[str, list[str]] = field(default_factory=dict)
    files: dict[str, list[bytes]] = field(default_factory=dict)

    def names(self) -> set[str]:
        return set(self.fields) | set(self.files)


@dataclass
class _Part:
    name: str = ""
    is_file: bool = False
    data: bytearray = field(default_factory=bytearray)


@dataclass
class FormLimits:
    max_parts: int
    max_files: int
    max_file_bytes: int
    max_field_bytes: int


class _Reader:
    """python-multipart callbacks that build a Form within FormLimits."""

    def __init__(self, limits: FormLimits, charset: str) -> None:
        self.limits = limits
        self.charset = charset
        self.form = Form()
        self.part = _Part()
        self.parts = 0
        self.file_count = 0
        self._header_name = b""
        self._header_value = b""
        self._disposition = b""

    def on_part_begin(self) -> None:
        self.part = _Part()
        self._disposition = b""
        self.parts += 1
        if self.parts > self.limits.max_parts:
            raise errors.InvalidRequest(f"the form has more than {self.limits.max_parts} parts")

    def on_header_field(self, data: bytes, start: int, end: int) -> None:
        self._header_name += data[start:end]

    def on_header_value(self, data: bytes, start: int, end: int) -> None:
        self._header_value += data[start:end]
        if len(self._header_value) > 4096:
            raise errors.BadRequest("a multipart part header is too long")

    def on_header_end(self) -> None:
        if self._header_name.lower() == b"content-disposition":
            self._disposition = self._header_value
        self._header_name, self._header_value = b"", b""

    def on_headers_finished(self) -> None:
        _, options = parse_options_header(self._disposition)
        if b"name" not in options:
            raise errors.BadRequest("a multipart part has no Content-Disposition name")
        self.part.name = options[b"name"].decode(self.charset, errors="replace")
        if b"filename" in options:
            self.part.is_file = True
            self.file_count += 1
            if self.file_count > self.limits.max_files:
                raise errors.TooManyImages(f"the form has more than {self.limits.max_files} files")

    def on_part_data(self, data: bytes, start: int, end: int) -> None:
        self.part.data += data[start:end]
        if self.part.is_file and len(self.part.data) > self.limits.max_file_bytes:
            raise errors.ImageTooLarge(
                f"file {errors.clip(self.part.name)!r} #{self.file_count} is over "
                f"LAD_MAX_IMAGE_BYTES={self.limits.max_file_bytes} bytes"
            )
        if not self.part.is_file and len(self.part.data) > self.limits.max_field_bytes:
            raise errors.InvalidRequest(
                f"form field {errors.clip(self.part.name)!r} is over "
                f"{self.limits.max_field_bytes} bytes"
            )

    def on_part_end(self) -> None:
        if self.part.is_file:
            self.form.files.setdefault(self.part.name, []).append(bytes(self.part.data))
        else:
            text = self.part.data.decode(self.charset, errors="replace")
            self.form.fields.setdefault(self.part.name, []).append(text)


async def read_form(request: Request, limits: FormLimits) -> Form:
    """Stream the request body through a bounded multipart parser (off the event loop:
    python-multipart is pure Python, 56 MB of parts cost it about 0.6 s)."""
    _, params = parse_options_header(request.headers.get("content-type", ""))
    boundary = params.get(b"boundary")
    if not boundary:
        raise errors.BadRequest("multipart/form-data without a boundary")
    charset = params.get(b"charset", b"utf-8").decode("latin-1")
    reader = _Reader(limits, charset if charset.lower() in ("utf-8", "utf8") else "latin-1")
    callbacks = {
        "on_part_begin": reader.on_part_begin,
        "on_part_data": reader.on_part_data,
        "on_part_end": reader.on_part_end,
        "on_header_field": reader.on_header_field,
        "on_header_value": reader.on_header_value,
        "on_header_end": reader.on_header_end,
        "on_headers_finished": reader.on_headers_finished,
    }
    try:  # the constructor refuses a boundary over MAX_BOUNDARY_LENGTH (256 bytes)
        parser = python_multipart.MultipartParser(boundary, callbacks)
    except FormParserError:
        raise errors.BadRequest(
            f"the multipart boundary has {len(boundary)} bytes; at most "
            f"{MAX_BOUNDARY_LENGTH} are accepted"
        ) from None
    try:
        async for chunk in request.stream():  # parsed on a worker thread, as it arrives
            await run_in_threadpool(parser.write, chunk)
        parser.finalize()
    except FormParserError:
        raise errors.BadRequest("the multipart body is malformed") from None
    if parser.state != MultipartState.END:  # finalize() does not check it (python-multipart)
        raise errors.BadRequest(
            "the multipart body ends before its closing boundary (a cut or unfinished upload)"
        )
    return reader.form


def split_form(
    form: Form, files_field: str, option_fields: Sequence[str]
) -> tuple[dict[str, Any], str, list[str | bytes]]:
    """A query form's option fields (raw text), its ``query`` and its files (file parts
    first, then base64 text parts); unknown, repeated or missing fields are 422."""
    unknown = sorted(form.names() - {"query", files_field, *option_fields})
    if unknown:
        raise errors.InvalidRequest(f"unknown form field(s): {errors.clip(', '.join(unknown))}")
    repeated = sorted(k for k, v in form.fields.items() if len(v) > 1 and k != files_field)
    if repeated:
        raise errors.InvalidRequest(f"form field(s) sent more than once: {', '.join(repeated)}")
    query = form.fields.get("query", [None])[0]
    if query is None:
        raise errors.InvalidRequest("form field `query` (text) is required")
    files: list[str | bytes] = [*form.files.get(files_field, []), *form.fields.get(files_field, [])]
    raw: dict[str, Any] = {k: form.fields[k][0] for k in option_fields if k in form.fields}
    return raw, query, files


def form_options(model: Any, raw: dict[str, Any]) -> Any:
    """The options model from a form's fields (pydantic errors located under "form")."""
    try:
        return model.model_validate(raw)
    except ValidationError as exc:
        raise validation_error(exc, "form") from None


def query_form_limits(settings: LimitsSettings, files: int, option_fields: int) -> FormLimits:
    """The limits of a query form: ``files`` image parts, the options, the query."""
    return FormLimits(
        max_parts=files + option_fields + 1,
        max_files=files,
        max_file_bytes=settings.max_image_bytes,
        max_field_bytes=max(4 * settings.max_query_chars, 64 * 1024),
    )


async def read_query_body(
    request: Request, settings: Any, route: ServedRoute, max_files: int
) -> tuple[Any, str, list[str | bytes]]:
    """The body of a query route (retrieve, rerank), JSON or multipart/form-data, as its
    route table entry describes it (models, the files' field), a form taking at most
    ``max_files`` files (the route's own setting): (options, query, the images in order).
    The JSON body is its own options (its images as sent); a form's label text is read by
    the service's one label-text parser."""
    assert route.request_model and route.form_files and route.options_model
    if is_json(accepted_media_type(request, route)):
        body = await read_json(request, route)
        return body, body.query, list(getattr(body, route.form_files))  # the wire field
    options_model = route.options_model
    option_fields = tuple(options_model.model_fields)
    limits = query_form_limits(settings, max_files, len(option_fields))
    form = await read_form(request, limits)
    raw, query, files = split_form(form, route.form_files, option_fields)
    if route.form_labels and "labels" in raw:
        labels = parse_label_text(raw["labels"])
        raw["labels"] = labels if isinstance(labels, str) else list(labels)
    return form_options(options_model, raw), query, files
