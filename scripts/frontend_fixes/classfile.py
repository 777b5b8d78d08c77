"""Just enough of the JVM class-file format to redirect a method call: read the constant pool, append to it, find the
call instructions inside a method's code and point them at another method of the same shape.

Only same-size rewrites are made (an ``invokevirtual``/``invokestatic`` of 3 bytes becomes an ``invokestatic`` of 3
bytes, taking the same operands from the stack), so no branch offset, stack map frame or exception range moves.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field

MAGIC = 0xCAFEBABE
INVOKEVIRTUAL, INVOKESTATIC = 0xB6, 0xB8

# Constant-pool tags and the size of their payload in bytes (Utf8 is length-prefixed and read apart).
UTF8, CLASS, STRING, METHODREF, NAME_AND_TYPE = 1, 7, 8, 10, 12
_FIXED_SIZES = {
    3: 4,
    4: 4,
    5: 8,
    6: 8,
    CLASS: 2,
    STRING: 2,
    9: 4,
    METHODREF: 4,
    11: 4,
    NAME_AND_TYPE: 4,
    15: 3,
    16: 2,
    17: 4,
    18: 4,
    19: 2,
    20: 2,
}
_TWO_SLOTS = {5, 6}  # Long and Double take two constant-pool indexes


class ClassFileError(ValueError):
    """The bytes are not a class file this module can read, or a call to rewrite is not where it was expected."""


@dataclass(frozen=True)
class MethodCode:
    """One method's bytecode: where it starts inside the class file and how long it is."""

    name: str
    descriptor: str
    code_start: int
    code_length: int


@dataclass
class ClassFile:
    data: bytearray
    constants: dict[int, tuple[int, object]] = field(default_factory=dict)
    pool_count: int = 0
    pool_end: int = 0

    @classmethod
    def parse(cls, raw: bytes) -> ClassFile:
        data = bytearray(raw)
        if len(data) < 10 or struct.unpack_from(">I", data, 0)[0] != MAGIC:
            raise ClassFileError("not a class file")
        parsed = cls(data=data)
        parsed._read_pool()
        return parsed

    def _read_pool(self) -> None:
        count = struct.unpack_from(">H", self.data, 8)[0]
        offset, index = 10, 1
        while index < count:
            tag = self.data[offset]
            if tag == UTF8:
                length = struct.unpack_from(">H", self.data, offset + 1)[0]
                value: object = bytes(self.data[offset + 3 : offset + 3 + length]).decode("utf-8", "surrogatepass")
                offset += 3 + length
            elif tag in _FIXED_SIZES:
                size = _FIXED_SIZES[tag]
                value = bytes(self.data[offset + 1 : offset + 1 + size])
                offset += 1 + size
            else:
                raise ClassFileError(f"unknown constant-pool tag {tag} at byte {offset}")
            self.constants[index] = (tag, value)
            index += 2 if tag in _TWO_SLOTS else 1
        self.pool_count, self.pool_end = count, offset

    def _u2(self, payload: object, at: int) -> int:
        assert isinstance(payload, bytes)
        return int(struct.unpack_from(">H", payload, at)[0])

    def utf8(self, index: int) -> str:
        tag, value = self.constants[index]
        if tag != UTF8 or not isinstance(value, str):
            raise ClassFileError(f"constant {index} is not text")
        return value

    def method_ref(self, index: int) -> tuple[str, str, str] | None:
        """(owner class, method name, descriptor) of a Methodref constant, else None."""
        tag, payload = self.constants.get(index, (0, b""))
        if tag != METHODREF:
            return None
        owner = self.utf8(self._u2(self.constants[self._u2(payload, 0)][1], 0))
        name_and_type = self.constants[self._u2(payload, 2)][1]
        return owner, self.utf8(self._u2(name_and_type, 0)), self.utf8(self._u2(name_and_type, 2))

    def _append(self, tag: int, payload: bytes) -> int:
        index = self.pool_count
        entry = bytes([tag]) + payload
        self.data[self.pool_end : self.pool_end] = entry
        self.pool_end += len(entry)
        self.pool_count += 1
        struct.pack_into(">H", self.data, 8, self.pool_count)
        value: object = payload[2:].decode("utf-8") if tag == UTF8 else payload
        self.constants[index] = (tag, value)
        return index

    def add_method_ref(self, owner: str, name: str, descriptor: str) -> int:
        """A new Methodref constant (owner/name/descriptor) and the index that names it."""

        def utf8(text: str) -> int:
            encoded = text.encode("utf-8")
            return self._append(UTF8, struct.pack(">H", len(encoded)) + encoded)

        owner_class = self._append(CLASS, struct.pack(">H", utf8(owner)))
        name_and_type = self._append(NAME_AND_TYPE, struct.pack(">HH", utf8(name), utf8(descriptor)))
        return self._append(METHODREF, struct.pack(">HH", owner_class, name_and_type))

    def methods(self) -> list[MethodCode]:
        offset = self.pool_end + 6  # access flags, this class, super class
        interfaces = struct.unpack_from(">H", self.data, offset)[0]
        offset += 2 + 2 * interfaces
        offset = self._skip_members(offset)  # fields
        count = struct.unpack_from(">H", self.data, offset)[0]
        offset += 2
        found = []
        for _ in range(count):
            name = self.utf8(struct.unpack_from(">H", self.data, offset + 2)[0])
            descriptor = self.utf8(struct.unpack_from(">H", self.data, offset + 4)[0])
            attributes = struct.unpack_from(">H", self.data, offset + 6)[0]
            offset += 8
            for _ in range(attributes):
                attribute_name = self.utf8(struct.unpack_from(">H", self.data, offset)[0])
                length = struct.unpack_from(">I", self.data, offset + 2)[0]
                if attribute_name == "Code":
                    code_length = struct.unpack_from(">I", self.data, offset + 10)[0]
                    found.append(MethodCode(name, descriptor, offset + 14, code_length))
                offset += 6 + length
        return found

    def _skip_members(self, offset: int) -> int:
        count = struct.unpack_from(">H", self.data, offset)[0]
        offset += 2
        for _ in range(count):
            attributes = struct.unpack_from(">H", self.data, offset + 6)[0]
            offset += 8
            for _ in range(attributes):
                offset += 6 + struct.unpack_from(">I", self.data, offset + 2)[0]
        return offset

    def instructions(self, method: MethodCode) -> list[tuple[int, int]]:
        """(absolute byte offset, opcode) of every instruction of ``method``, in order."""
        code = self.data[method.code_start : method.code_start + method.code_length]
        found, pc = [], 0
        while pc < len(code):
            found.append((method.code_start + pc, code[pc]))
            pc += _instruction_length(code, pc)
        if pc != len(code):
            raise ClassFileError(f"{method.name}: the last instruction runs past the method's code")
        return found

    def _calls(self, method_name: str, target: tuple[str, str, str]) -> list[int]:
        """Byte offsets of the calls of ``target`` inside ``method_name`` (every method for "*")."""
        found = []
        for method in self.methods():
            if method_name not in ("*", method.name):
                continue
            for offset, opcode in self.instructions(method):
                if opcode in (INVOKEVIRTUAL, INVOKESTATIC):
                    if self.method_ref(struct.unpack_from(">H", self.data, offset + 1)[0]) == target:
                        found.append(offset)
        return found

    def redirect_calls(self, method_name: str, target: tuple[str, str, str], replacement: tuple[str, str, str]) -> int:
        """Point every call of ``target`` inside ``method_name`` (every method for "*") at the static ``replacement``.

        ``replacement`` must take the receiver (for an instance ``target``) and then the same arguments, and return the
        same type. Returns how many calls were rewritten."""
        if not self._calls(method_name, target):
            return 0
        new_index = self.add_method_ref(*replacement)
        calls = self._calls(method_name, target)  # again: the constant pool grew in front of the code
        for offset in calls:
            self.data[offset] = INVOKESTATIC
            struct.pack_into(">H", self.data, offset + 1, new_index)
        return len(calls)


def _instruction_length(code: bytes | bytearray, pc: int) -> int:
    opcode = code[pc]
    if opcode == 0xAA:  # tableswitch: padding to 4, default, low, high, then (high - low + 1) offsets
        start = pc + 1 + (-(pc + 1) % 4)
        low, high = struct.unpack_from(">ii", code, start + 4)
        return start - pc + 12 + 4 * (high - low + 1)
    if opcode == 0xAB:  # lookupswitch: padding, default, npairs, then npairs (match, offset) pairs
        start = pc + 1 + (-(pc + 1) % 4)
        pairs = struct.unpack_from(">i", code, start + 4)[0]
        return start - pc + 8 + 8 * pairs
    if opcode == 0xC4:  # wide: iinc takes two 2-byte operands, the loads and stores one
        return 6 if code[pc + 1] == 0x84 else 4
    return _LENGTHS[opcode]


def _lengths() -> list[int]:
    lengths = [1] * 256
    for opcode in (0x10, 0x12, *range(0x15, 0x1A), *range(0x36, 0x3B), 0xA9, 0xBC):
        lengths[opcode] = 2
    for opcode in (0x11, 0x13, 0x14, 0x84, *range(0x99, 0xA9), *range(0xB2, 0xB9), 0xBB, 0xBD, 0xC0, 0xC1, 0xC6, 0xC7):
        lengths[opcode] = 3
    lengths[0xC5] = 4
    for opcode in (0xB9, 0xBA, 0xC8, 0xC9):
        lengths[opcode] = 5
    return lengths


_LENGTHS = _lengths()
