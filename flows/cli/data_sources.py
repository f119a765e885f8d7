"""The documents of ``sailor data prepare``'s input files, as pieces of text in reading order.

A text file (any name but the two below) is one document, read in blocks cut at line ends.
A ``.jsonl`` file holds one document per line: a JSON object whose text field (``--text-field``)
is the text, or whose messages field (``--messages-field``, a list of ``{"role", "content"}``)
is rendered with the tokenizer's chat template, as transformers' ``apply_chat_template``
renders it without a generation prompt.  A ``.parquet`` file holds one document per row of a
named column (text, or messages), read a row group at a time.  A null value is no document.
"""

from __future__ import annotations

import datetime
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from sailor_core.errors import InputError

BLOCK_BYTES = 64 << 10  # one piece of a text file, cut at a line end


@dataclass(frozen=True, slots=True, kw_only=True)
class Piece:
    text: str
    num_bytes: int  # the input bytes read for it (progress)
    ends_document: bool


@dataclass(frozen=True, slots=True, kw_only=True)
class Fields:
    """Where the text is in a record: ``messages`` (chat, rendered) when set, else ``text``."""
    text: str = "text"
    messages: str | None = None

    @property
    def name(self) -> str:
        return self.messages or self.text


class ChatTemplate:
    """A tokenizer's Jinja chat template, in the sandbox and with the helpers transformers gives it."""

    def __init__(self, source: str, special_tokens: dict[str, str]) -> None:
        # lazy: jinja2, only when chat messages are prepared
        import jinja2
        import jinja2.ext
        import jinja2.nodes
        from jinja2.sandbox import ImmutableSandboxedEnvironment

        def raise_exception(message: str):
            raise jinja2.exceptions.TemplateError(message)

        def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
            return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

        def strftime_now(fmt: str) -> str:
            return datetime.datetime.now().strftime(fmt)

        class Generation(jinja2.ext.Extension):
            """``{% generation %}...{% endgeneration %}`` (transformers marks assistant tokens with it):
            its body, as rendered; the marks only matter to training masks, which packing has not."""
            tags = {"generation"}

            def parse(self, parser):
                lineno = next(parser.stream).lineno
                body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
                return jinja2.nodes.Scope(body, lineno=lineno)

        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                            extensions=[Generation, jinja2.ext.loopcontrols])
        env.filters["tojson"] = tojson
        env.globals["raise_exception"] = raise_exception
        env.globals["strftime_now"] = strftime_now
        try:
            self._template = env.from_string(source)
        except jinja2.exceptions.TemplateError as exc:
            raise InputError(f"the tokenizer's chat template does not compile: {exc}") from None
        self._special_tokens = special_tokens
        self._error = jinja2.exceptions.TemplateError

    def render(self, messages: list, where: str) -> str:
        try:
            return self._template.render(messages=messages, add_generation_prompt=False, tools=None, documents=None,
                                         **self._special_tokens)
        except self._error as exc:
            raise InputError(f"{where}: the chat template refuses these messages: {exc}") from None


def load_chat_template(tokenizer_path: Path) -> ChatTemplate:
    """The chat template of ``tokenizer_config.json`` beside ``tokenizer.json`` (its default one
    when it has several), with the config's special tokens as the template's variables."""
    config_path = tokenizer_path.with_name("tokenizer_config.json")
    if not config_path.is_file():
        raise InputError(f"--messages-field needs a chat template: no {str(config_path)!r} beside the tokenizer")
    try:
        config = json.loads(config_path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise InputError(f"cannot read {str(config_path)!r}: {exc}") from None
    template = config.get("chat_template") if isinstance(config, dict) else None
    if isinstance(template, list):  # named templates: the default one
        template = next((t.get("template") for t in template if isinstance(t, dict) and t.get("name") == "default"),
                        None)
    if not isinstance(template, str) or not template:
        raise InputError(f"--messages-field needs a chat template: {str(config_path)!r} has no chat_template")
    special = {}
    for key, value in config.items():
        if key.endswith("_token") and isinstance(value, dict | str):
            content = value.get("content") if isinstance(value, dict) else value
            if isinstance(content, str):
                special[key] = content
    return ChatTemplate(template, special)


def document_pieces(path: Path, fields: Fields, chat: ChatTemplate | None) -> Iterator[Piece]:
    if path.suffix == ".jsonl":
        return _jsonl_pieces(path, fields, chat)
    if path.suffix == ".parquet":
        return _parquet_pieces(path, fields, chat)
    return _text_pieces(path)


def _text_pieces(path: Path) -> Iterator[Piece]:
    """The file's blocks, each cut after a line end; the last one ends the document."""
    previous = None
    for text, num_bytes in _blocks(path):
        if previous is not None:
            yield Piece(text=previous[0], num_bytes=previous[1], ends_document=False)
        previous = (text, num_bytes)
    if previous is not None:
        yield Piece(text=previous[0], num_bytes=previous[1], ends_document=True)


def _blocks(path: Path) -> Iterator[tuple[str, int]]:
    """(text, bytes) blocks of a UTF-8 file, each cut after a line end (the last one at the end)."""
    with open(path, "rb") as fh:
        rest, offset = b"", 0
        while True:
            data = fh.read(BLOCK_BYTES)
            buf = rest + data
            cut = buf.rfind(b"\n") + 1 if data else len(buf)
            if cut == 0 and data:
                cut = len(buf) if len(buf) > 16 * BLOCK_BYTES else 0  # one very long line: cut anyway
            block, rest = buf[:cut], buf[cut:]
            if block:
                try:
                    text = block.decode("utf-8")
                except UnicodeDecodeError as exc:
                    raise InputError(f"input {str(path)!r} is not UTF-8 text (byte {offset + exc.start})") from None
                yield text, len(block)
                offset += len(block)
            if not data:
                return


def _document(value, fields: Fields, chat: ChatTemplate | None, where: str) -> str | None:
    """A record's value as the document's text (None: no document)."""
    if value is None:
        return None
    if fields.messages is not None:
        if not isinstance(value, list):
            raise InputError(f"{where}: {fields.messages!r} is not a list of messages")
        assert chat is not None, "load_chat_template before reading messages"
        return chat.render(value, where)
    if not isinstance(value, str):
        raise InputError(f"{where}: {fields.text!r} is {type(value).__name__}, not text")
    return value


def _jsonl_pieces(path: Path, fields: Fields, chat: ChatTemplate | None) -> Iterator[Piece]:
    with open(path, "rb") as fh:
        for line_no, raw in enumerate(fh, 1):
            where = f"{path.name} line {line_no}"
            if not raw.strip():
                continue
            try:
                record = json.loads(raw)
            except (UnicodeDecodeError, json.JSONDecodeError) as exc:
                raise InputError(f"{where} is not a JSON object: {exc}") from None
            if not isinstance(record, dict):
                raise InputError(f"{where} is not a JSON object")
            if fields.name not in record:
                raise InputError(f"{where} has no field {fields.name!r} (it has: {', '.join(map(str, record)) or 'none'};"
                                 f" name it with {'--messages-field' if fields.messages else '--text-field'})")
            text = _document(record[fields.name], fields, chat, where)
            if text:
                yield Piece(text=text, num_bytes=len(raw), ends_document=True)


def _parquet_pieces(path: Path, fields: Fields, chat: ChatTemplate | None) -> Iterator[Piece]:
    """One row group in memory at a time; its rows' bytes are the file's share of the group."""
    import pyarrow.parquet as pq  # lazy: only for Parquet inputs

    try:
        pf = pq.ParquetFile(path)
    except Exception as exc:  # pyarrow's own errors (ArrowInvalid, OSError) on a file that is not Parquet
        raise InputError(f"input {str(path)!r} is not a Parquet file: {str(exc).splitlines()[0]}") from None
    names = pf.schema_arrow.names
    if fields.name not in names:
        raise InputError(f"{path.name} has no column {fields.name!r} (it has: {', '.join(names)}; "
                         f"name it with {'--messages-field' if fields.messages else '--text-field'})")
    size, num_groups = path.stat().st_size, pf.num_row_groups
    row = 0
    for group in range(num_groups):
        values = pf.read_row_group(group, columns=[fields.name]).column(0).to_pylist()
        share = size * (group + 1) // num_groups - size * group // num_groups
        for value in values:
            row += 1
            text = _document(value, fields, chat, f"{path.name} row {row}")
            if text:
                yield Piece(text=text, num_bytes=0, ends_document=True)
        yield Piece(text="", num_bytes=share, ends_document=False)  # the group's bytes, for progress
