"""Every name in protos/ generates clean code in the major languages: no package, message, field,
enum, enum value, service or method is a reserved word of C++, Go, Java, C#, TypeScript/JavaScript,
Python, Rust or Swift (generators mangle such names, e.g. C++ `union_()`), and every file carries
the per-language options so generators need no flags (buf lint cannot check either)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from google.protobuf import descriptor_pb2

from motor_common.gen.motor.common.v1 import types_pb2
from motor_common.gen.motor.controller.v1 import controller_pb2
from motor_common.gen.motor.coordinator.v1 import coordinator_pb2, front_worker_pb2
from motor_common.gen.motor.nodemanager.v1 import nodemanager_pb2

PROTOS = Path(__file__).resolve().parents[2] / "protos"

KEYWORDS: dict[str, set[str]] = {
    "C++": set("""alignas alignof and and_eq asm auto bitand bitor bool break case catch char char8_t char16_t
        char32_t class compl concept const consteval constexpr constinit const_cast continue co_await co_return
        co_yield decltype default delete do double dynamic_cast else enum explicit export extern false float for
        friend goto if inline int long mutable namespace new noexcept not not_eq nullptr operator or or_eq private
        protected public register reinterpret_cast requires return short signed sizeof static static_assert
        static_cast struct switch template this thread_local throw true try typedef typeid typename union unsigned
        using virtual void volatile wchar_t while xor xor_eq NULL errno major minor""".split()),
    "Go": set("""break case chan const continue default defer else fallthrough for func go goto if import interface
        map package range return select struct switch type var""".split()),
    "Java": set("""abstract assert boolean break byte case catch char class const continue default do double else
        enum extends final finally float for goto if implements import instanceof int interface long native new
        package private protected public return short static strictfp super switch synchronized this throw throws
        transient try void volatile while true false null record var yield sealed permits""".split()),
    "C#": set("""abstract as base bool break byte case catch char checked class const continue decimal default
        delegate do double else enum event explicit extern false finally fixed float for foreach goto if implicit
        in int interface internal is lock long namespace new null object operator out override params private
        protected public readonly ref return sbyte sealed short sizeof stackalloc static string struct switch this
        throw true try typeof uint ulong unchecked unsafe ushort using virtual void volatile while""".split()),
    "TypeScript/JavaScript": set("""break case catch class const continue debugger default delete do else enum
        export extends false finally for function if import in instanceof new null return super switch this throw
        true try typeof var void while with implements interface let package private protected public static yield
        await any boolean constructor declare get module require number set string symbol type from of
        arguments eval""".split()),
    "Python": set("""False None True and as assert async await break class continue def del elif else except
        finally for from global if import in is lambda nonlocal not or pass raise return try while with yield
        match case type""".split()),
    "Rust": set("""as break const continue crate else enum extern false fn for if impl in let loop match mod move
        mut pub ref return self Self static struct super trait true type unsafe use where while async await dyn
        abstract become box do final macro override priv typeof unsized virtual yield try union""".split()),
    "Swift": set("""associatedtype class deinit enum extension fileprivate func import init inout internal let
        open operator private precedencegroup protocol public rethrows static struct subscript typealias var break
        case catch continue default defer do else fallthrough for guard if in repeat return throw switch where
        while Any as await false is nil self Self super throws true try Type Protocol""".split()),
}

FILES = [types_pb2, controller_pb2, coordinator_pb2, front_worker_pb2, nodemanager_pb2]


def _file_protos() -> list[descriptor_pb2.FileDescriptorProto]:
    out = []
    for module in FILES:
        fdp = descriptor_pb2.FileDescriptorProto()
        module.DESCRIPTOR.CopyToProto(fdp)
        out.append(fdp)
    return out


def _names(fdp: descriptor_pb2.FileDescriptorProto) -> list[tuple[str, str]]:
    """(where, name) for every identifier a generator turns into code."""
    names = [(fdp.name, part) for part in fdp.package.split(".")]

    def message(prefix: str, m: descriptor_pb2.DescriptorProto) -> None:
        where = f"{prefix}.{m.name}"
        names.append((where, m.name))
        names.extend((f"{where}.{f.name}", f.name) for f in m.field)
        names.extend((f"{where}.{o.name}", o.name) for o in m.oneof_decl)
        for e in m.enum_type:
            enum(where, e)
        for nested in m.nested_type:
            if not nested.options.map_entry:
                message(where, nested)

    def enum(prefix: str, e: descriptor_pb2.EnumDescriptorProto) -> None:
        names.append((f"{prefix}.{e.name}", e.name))
        names.extend((f"{prefix}.{e.name}.{v.name}", v.name) for v in e.value)

    for m in fdp.message_type:
        message(fdp.package, m)
    for e in fdp.enum_type:
        enum(fdp.package, e)
    for s in fdp.service:
        names.append((f"{fdp.package}.{s.name}", s.name))
        names.extend((f"{fdp.package}.{s.name}.{m.name}", m.name) for m in s.method)
    return names


def test_every_proto_file_is_scanned() -> None:
    on_disk = {str(p.relative_to(PROTOS)) for p in PROTOS.rglob("*.proto") if p.parts[-4] != "google"}
    assert {f.name for f in _file_protos()} >= {n for n in on_disk if n.startswith("motor/")}


@pytest.mark.parametrize("language", sorted(KEYWORDS))
def test_no_name_is_a_keyword(language: str) -> None:
    words = KEYWORDS[language]
    clashes = [where for fdp in _file_protos() for where, name in _names(fdp) if name in words]
    assert not clashes, f"{language} keywords used as proto names: {clashes}"


def test_the_scan_sees_fields() -> None:
    # The scan would have caught the old InstanceSummary.union: it visits field names.
    names = {where for fdp in _file_protos() for where, _ in _names(fdp)}
    assert "motor.coordinator.v1.InstanceSummary.union_instances" in names
    assert "motor.common.v1.Instance.id" in names


def test_every_file_sets_the_language_options() -> None:
    for fdp in _file_protos():
        o = fdp.options
        leaf = fdp.package.split(".")[1]
        assert o.go_package == f"motor/clients/go/gen/motor/{leaf}/v1;{leaf}v1", fdp.name
        assert o.java_package == fdp.package and o.java_multiple_files, fdp.name
        assert re.fullmatch(r"Motor\.[A-Z][a-z]+\.V1", o.csharp_namespace), fdp.name
        assert o.php_namespace == o.csharp_namespace.replace(".", "\\"), fdp.name
        assert o.ruby_package == o.csharp_namespace.replace(".", "::"), fdp.name
        assert len(o.objc_class_prefix) == 3, fdp.name
    prefixes = [f.options.objc_class_prefix for f in _file_protos()]
    assert len(set(prefixes)) == len(prefixes)  # ObjC has one flat namespace
