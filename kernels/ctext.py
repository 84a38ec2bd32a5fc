"""Model text in generated source: the one encoder, and a lint of the finished source.

A model file is data. Its names (tensors, nodes, the file name) appear in generated C and CUDA only inside
comments and string literals, for a person reading a dumped kernel or an error message, and only through
`encode`. The encoder keeps a small set of characters that cannot end a comment (`*/`), end a string (`"`),
splice a line (backslash-newline), form a trigraph (`??/`), start a format directive (`%`) or hide in a
non-ASCII spelling; every other byte of the UTF-8 text becomes `~XX`. Identifiers are never made from model
text: kernels, functions, variables and tables get generated names.

`lint` checks the whole generated file before it is compiled: printable ASCII only, no `??` anywhere, and a
backslash at the end of a line only inside a `#define` of our own templates. A name that reached the source
without `encode` and tried one of those tricks fails here, before any compiler sees it.
"""

from __future__ import annotations

import hashlib
import re
import string

from evonnx.errors import InternalError

# `/` stays so that exported node names ("/model.22/Concat") remain readable, and `*` so that sizes ("3*H*W") do;
# the second character of `*/` or `/*` is encoded, so neither ever appears.
_SAFE = frozenset(string.ascii_letters + string.digits + " _.,:;()[]{}<>=+-*#@!/|^&'$")
_MAX_CHARS = 96  # a longer name is cut, with a digest of the whole name so different names stay apart


def encode(text: str, limit: int = _MAX_CHARS) -> str:
    """`text` as comment or string-literal content: safe characters kept, every other UTF-8 byte as `~XX`."""
    out: list[str] = []
    for ch in text[:limit + 1]:  # what is cut needs no encoding (sizes nested to megabytes of text: fuzz case 109)
        if ch in _SAFE and not (out and out[-1] + ch in ("*/", "/*")):
            out.append(ch)
        else:
            out.extend(f"~{b:02X}" for b in ch.encode("utf-8", "surrogatepass"))
    s = "".join(out)
    if len(s) > limit:
        digest = hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:12]
        s = f"{s[:limit - 20].rstrip('*')}...(#{digest})"
    return s


_DEFINE = re.compile(r"\s*#\s*define\b")


def lint(source: str, what: str) -> None:
    """Raise InternalError unless `source` keeps the invariants above (it is generated: a failure is our bug)."""
    bad = re.search(r"[^\x20-\x7e\n]", source)
    if bad is not None:
        raise InternalError(f"{what}: generated source has a non-printable or non-ASCII character on line "
                            f"{source.count(chr(10), 0, bad.start()) + 1}")
    at = source.find("??")
    if at >= 0:
        raise InternalError(f"{what}: generated source has '??' (a trigraph) on line "
                            f"{source.count(chr(10), 0, at) + 1}")
    in_define = False
    for n, text in enumerate(source.split("\n"), 1):
        continued = text.endswith("\\")
        if continued and not (in_define or _DEFINE.match(text)):
            raise InternalError(f"{what}: generated source splices line {n} outside a #define")
        in_define = continued and (in_define or bool(_DEFINE.match(text)))
