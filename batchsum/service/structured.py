"""Structured fields (RFC 8941) as rate-limit headers use them: a field's Lists and Dictionaries of
Integers, Decimals, Strings, Tokens and Byte Sequences with their parameters; a malformed field is
ignored whole (``read_list`` / ``read_dictionary`` give None), never guessed at.
"""

from __future__ import annotations

import re

__all__ = ["Item", "Token", "read_list", "read_dictionary"]


Item = tuple[object, dict[str, object]]  # a bare item and its parameters


class _Malformed(Exception):
    """Not a structured field: the whole field is ignored (RFC 8941, section 4.2)."""


class Token(str):
    """A Token, as distinct from a String (either names a policy)."""


def read_list(text: str | None) -> list[Item] | None:
    """``text`` as a List of Items, or None when absent or malformed."""
    if text is None:
        return None
    try:
        return _StructuredField(text).list()
    except _Malformed:
        return None


def read_dictionary(text: str | None) -> dict[str, Item] | None:
    """``text`` as a Dictionary of Items, or None when absent or malformed."""
    if text is None:
        return None
    try:
        return _StructuredField(text).dictionary()
    except _Malformed:
        return None


_TCHAR = frozenset("!#$%&'*+-.^_`|~:/0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ")
_KEY_FIRST = frozenset("abcdefghijklmnopqrstuvwxyz*")
_KEY_CHAR = _KEY_FIRST | frozenset("0123456789_-.")
_BASE64 = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/=")
_NUMBER = re.compile(r"-?([0-9]{1,15})(?:\.([0-9]{1,3}))?")
_DIGIT_GROUP = re.compile(r"[0-9]{3}")


class _StructuredField:
    """One field value read left to right. Inner lists, Dates and Display Strings are used by none
    of the forms and make a field malformed."""

    __slots__ = ("text", "at")

    def __init__(self, text: str) -> None:
        self.text = text.strip(" \t")
        self.at = 0

    def list(self) -> list[Item]:
        members: list[Item] = []
        while self.at < len(self.text):
            glued = self.at > 0 and self.text[self.at - 1] == ","
            start = self.at
            members.append((self.bare_item(), self.parameters()))
            if glued and _DIGIT_GROUP.fullmatch(self.text, start, self.at):
                raise _Malformed  # "1,000": a thousands separator, not a list of 1 and 0
            if not self._next_member():
                break
        return members

    def dictionary(self) -> dict[str, Item]:
        members: dict[str, Item] = {}
        while self.at < len(self.text):
            key = self.key()
            if self._peek() == "=":
                self.at += 1
                members[key] = (self.bare_item(), self.parameters())
            else:
                members[key] = (True, self.parameters())
            if not self._next_member():
                break
        return members

    def parameters(self) -> dict[str, object]:
        params: dict[str, object] = {}
        while True:
            mark = self.at
            self._skip(" \t")  # lenient: the first drafts' grammar allowed spaces before ";"
            if self._peek() != ";":
                self.at = mark
                return params
            self.at += 1
            self._skip(" ")
            key = self.key()
            if self._peek() == "=":
                self.at += 1
                params[key] = self.bare_item()
            else:
                params[key] = True

    def key(self) -> str:
        start = self.at
        if self._peek() not in _KEY_FIRST:
            raise _Malformed
        while self._peek() in _KEY_CHAR:
            self.at += 1
        return self.text[start : self.at]

    def bare_item(self) -> object:
        char = self._peek()
        if char == "-" or "0" <= char <= "9":
            return self._number()
        if char == '"':
            return self._string()
        if char == "*" or ("a" <= char.lower() <= "z" and char.isascii()):
            start = self.at
            self.at += 1
            while self._peek() in _TCHAR:
                self.at += 1
            return Token(self.text[start : self.at])
        if char == ":":
            end = self.text.find(":", self.at + 1)
            content = self.text[self.at + 1 : end]
            if end < 0 or not set(content) <= _BASE64:
                raise _Malformed
            self.at = end + 1
            return content.encode()
        if char == "?" and self.text[self.at + 1 : self.at + 2] in ("0", "1"):
            self.at += 2
            return self.text[self.at - 1] == "1"
        raise _Malformed

    def _number(self) -> int | float:
        match = _NUMBER.match(self.text, self.at)
        if match is None:
            raise _Malformed
        whole, fraction = match.groups()
        self.at = match.end()
        if (fraction is not None and len(whole) > 12) or "0" <= self._peek() <= "9" or self._peek() == ".":
            raise _Malformed  # 16 digits or more, 13 before a point, 4 after it, or a second point
        return float(match.group()) if fraction is not None else int(match.group())

    def _string(self) -> str:
        chars: list[str] = []
        self.at += 1
        while self.at < len(self.text):
            char = self.text[self.at]
            self.at += 1
            if char == '"':
                return "".join(chars)
            if char == "\\":
                char = self._peek()
                if char not in ('"', "\\"):
                    raise _Malformed
                self.at += 1
            elif not " " <= char <= "~":
                raise _Malformed
            chars.append(char)
        raise _Malformed  # no closing quote

    def _next_member(self) -> bool:
        """Past the comma to the next member; False at the end; malformed on anything else."""
        self._skip(" \t")
        if self.at == len(self.text):
            return False
        if self._peek() != ",":
            raise _Malformed
        self.at += 1
        self._skip(" \t")
        if self.at == len(self.text):
            raise _Malformed  # a trailing comma
        return True

    def _peek(self) -> str:
        return self.text[self.at] if self.at < len(self.text) else ""

    def _skip(self, chars: str) -> None:
        while self.at < len(self.text) and self.text[self.at] in chars:
            self.at += 1
