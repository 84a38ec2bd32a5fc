"""Adversarial text for model names, and the checks that none of it became code.

A payload is model text (a tensor, node, graph or initializer name, a dim_param, a doc string, the output file
name) that tries to leave a generated C comment or string literal and define a constructor that creates a marker
file. Each payload carries a canary identifier, `evo_canary_<run>_<k>`, so two checks can tell whether it got out:

- dynamic: the marker file appears when a process loads the library (`marker_path`);
- static (`escaped_identifiers`): the generated source, read as the C compiler reads it (trigraphs replaced,
  backslash-newlines spliced, comments and string and character literals removed), holds a canary identifier in
  its code. The check is run on a raw injection by the self-tests, so it cannot pass vacuously.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass

CANARY_PREFIX = "evo_canary_"

# The generated kernels are C11 compiled with -std=c11, under which gcc honours trigraphs.
_TRIGRAPHS = {"=": "#", "/": "\\", "'": "^", "(": "[", ")": "]", "!": "|", "<": "{", ">": "}", "-": "~"}
_TRIGRAPH = re.compile(r"\?\?([=/'()!<>\-])")


@dataclass(frozen=True)
class Canary:
    """One test run's canary: the marker file every payload's constructor creates, and the identifier tag."""

    marker: str  # absolute path, unique per run
    tag: str  # short unique token, part of every canary identifier

    def code(self, k: int) -> str:
        """C defining a constructor that creates the marker file (no header needed)."""
        ident = f"{CANARY_PREFIX}{self.tag}_{k}"
        return (f"extern int creat(const char *, unsigned int); __attribute__((constructor)) static void "
                f"{ident}(void) {{ creat(\"{self.marker}\", 420); }}")

    def identifier(self, k: int) -> str:
        return f"{CANARY_PREFIX}{self.tag}_{k}"


# Each template takes the canary code C and yields model text that leaves a comment or string in one way.
# (name, template, fits a file name: no '/' and no NUL)
TEMPLATES: tuple[tuple[str, str, bool], ...] = (
    ("comment-end", "*/ {C} /*", False),
    ("comment-end-splice", "*\\\n/ {C} /*", False),
    ("comment-end-trigraph", "*??/\n/ {C} /*", False),
    ("line-comment-newline", "x\n{C}\n//", False),
    ("line-comment-crlf", "x\r\n{C}\r\n//", False),
    ("newline-define", "x\n#define {I}_def 1\n", False),
    ("string-end", "\"); {C} static const char *{I}_s = (\"", False),
    ("string-end-comment", "*/\"); {C} static const char *{I}_s = (\"/*", False),
    ("string-trigraph-quote", "??/\"); {C} /*??/", False),
    ("string-splice", "\\\n\"); {C} /*\\", False),
    ("char-literal", "'); {C} /*'", False),
    ("include", "*/\n#include \"/dev/null\"\n{C} /*", False),
    ("format", "%n%n%s%s%1$n%99999999d{I}", True),
    ("python-format", "{{0.__class__.__mro__}}{{}}%s%(x)s{I}", True),
    ("non-ascii", "\u00e9\u202e\u2028\u00f1\u4e2d\U0001f600{I}\ufeff", True),
    ("newline-name", "x\n{I}\n\\", True),
    ("backslash-only", "\\\\\\{I}\\", True),
    ("trigraph-soup", "??=??(??)??<??>??!??'??-{I}??/", False),
    ("long", "L" * 3000 + "*/ {C} /*" + "M" * 3000, False),
)

# Payloads without a canary identifier that still must not break anything (ONNX allows any UTF-8 name).
PLAIN_ODD = ("a b", "-", "0", "x.y:z", "\u00e9", "%d", "''", "\t", "*", "/", "{}", "\\")


def payload(canary: Canary, template: str, k: int) -> str:
    ident = canary.identifier(k)
    return template.replace("{C}", canary.code(k)).replace("{I}", ident).replace("{{", "{").replace("}}", "}")


def file_name_payload(canary: Canary, template: str, k: int) -> str:
    """A payload usable in a file name: no '/' nor NUL, at most about 150 bytes."""
    text = payload(canary, template, k)
    assert "/" not in text and "\0" not in text
    return text


def file_name_templates() -> list[str]:
    return [t for _, t, ok in TEMPLATES if ok]


# -- reading generated C as the compiler does ------------------------------------------------------------------
def translation_phases_1_2(source: str) -> str:
    """Trigraph replacement, then deletion of every backslash-newline (C11 5.1.1.2, phases 1 and 2)."""
    source = source.replace("\r\n", "\n")
    source = _TRIGRAPH.sub(lambda m: _TRIGRAPHS[m.group(1)], source)
    return source.replace("\\\n", "")


def split_source(source: str) -> tuple[str, list[str], list[str]]:
    """(code, comments, literals) of C source after phases 1 and 2: code with every comment replaced by a space
    and every string or character literal by `""`; comments and literals (without their delimiters) as lists."""
    s = translation_phases_1_2(source)
    code: list[str] = []
    comments: list[str] = []
    literals: list[str] = []
    i, n = 0, len(s)
    while i < n:
        c = s[i]
        if s.startswith("/*", i):
            end = s.find("*/", i + 2)
            end = n if end < 0 else end
            comments.append(s[i + 2:end])
            code.append(" ")
            i = end + 2
        elif s.startswith("//", i):
            end = s.find("\n", i)
            end = n if end < 0 else end
            comments.append(s[i + 2:end])
            code.append(" ")
            i = end
        elif c in "\"'":
            j = i + 1
            while j < n and s[j] != c and s[j] != "\n":
                j += 2 if s[j] == "\\" else 1
            literals.append(s[i + 1:j])
            code.append('""')
            i = j + 1
        else:
            code.append(c)
            i += 1
    return "".join(code), comments, literals


def escaped_identifiers(source: str) -> list[str]:
    """Canary identifiers that the C compiler would read as code in `source` (empty when all stayed inert)."""
    code, _, _ = split_source(source)
    return sorted(set(re.findall(re.escape(CANARY_PREFIX) + r"\w*", code)))


def format_directives_from_names(source: str) -> list[str]:
    """String literals that hold a `%n` directive, or a canary identifier next to a `%` directive: model text
    inside a format string (generated code formats names with `%s` arguments, never inside the format)."""
    _, _, literals = split_source(source)
    out = []
    for lit in literals:
        if re.search(r"%[0-9$.\-+ #]*[hlLzjt]*n", lit) or (CANARY_PREFIX in lit and re.search(r"%[0-9]*\$", lit)):
            out.append(lit[:120])
    return out


def lint_violations(source: str) -> list[str]:
    """Properties every generated source keeps whatever the model says (README/STYLE "Generated code")."""
    out = []
    bad = re.search(r"[^\x20-\x7e\n]", source)
    if bad is not None:
        line = source.count("\n", 0, bad.start()) + 1
        out.append(f"non-printable or non-ASCII character {bad.group()!r} on line {line}")
    if "??" in source:
        out.append(f"'??' (a trigraph's start) on line {source.count(chr(10), 0, source.find('??')) + 1}")
    return out


def check_source(source: str) -> list[str]:
    """Every way model text escaped into `source`, as one-line findings (empty when none)."""
    problems = [f"canary identifier {i} is code in the generated C" for i in escaped_identifiers(source)]
    problems += [f"raw model text with a printf directive in a string literal: {lit!r}"
                 for lit in format_directives_from_names(source)]
    problems += [f"generated C: {p}" for p in lint_violations(source)]
    return problems


def all_payloads(canary: Canary, start: int = 0) -> Iterator[tuple[str, str]]:
    """(template name, text) of every template, numbered from `start`."""
    for k, (name, template, _) in enumerate(TEMPLATES, start):
        yield name, payload(canary, template, k)
