"""Print the C++ header that carries the operator contract (ports, attributes, messages) into the kernels.

The kernels must not restate what ``onnx_hybrid/ops/contract.py`` says, so the build runs this script and
the C++ code includes the result. contract.py is imported by file path: it needs nothing but the standard
library, so this runs before the package (or its dependencies) is installed.

Usage: python gen_contract_header.py > HEADER   (the build writes it only when it changed)
"""

from __future__ import annotations

import importlib.util
import json
import pathlib
import sys

CONTRACT_PATH = pathlib.Path(__file__).resolve().parents[2] / "contract.py"


def load_contract():
    spec = importlib.util.spec_from_file_location("onnx_hybrid_contract_for_build", CONTRACT_PATH)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look the module up while the class bodies run
    spec.loader.exec_module(module)
    return module


def c_string(text: str) -> str:
    return json.dumps(text)  # a JSON string literal of ASCII text is a valid C string literal


def camel(name: str) -> str:
    return "".join(part.capitalize() for part in name.split("_"))


def port_kind(port) -> str:
    return {"T": "PortType::kActivation", "float": "PortType::kFloat", "int32": "PortType::kInt32",
            "uint8": "PortType::kUint8", "gate": "PortType::kGate"}[port.type]


def op_block(c, op, namespace: str) -> list[str]:
    out = [f"namespace {namespace} {{", f"inline constexpr char kName[] = {c_string(op.name)};"]
    for kind, ports in (("Input", op.inputs), ("Output", op.outputs)):
        out.append(f"enum {kind} : int {{ " + ", ".join(f"k{kind}{camel(p.name)} = {p.index}" for p in ports)
                   + " };")
        out.append(f"inline constexpr int kNum{kind}s = {len(ports)};")
        out.append(f"inline constexpr PortSpec k{kind}Ports[] = {{")
        for p in ports:
            out.append(f"    {{{c_string(p.name)}, {port_kind(p)}, {str(p.optional).lower()}, "
                       f"{str(p.host_memory).lower()}}},")
        out.append("};")
    for a in op.attributes:
        name = camel(a.name)
        out.append(f"inline constexpr char kAttr{name}[] = {c_string(a.name)};")
        if a.kind == "string":
            out.append(f"inline constexpr char kDefault{name}[] = {c_string(a.default)};")
            out.append(f"inline constexpr const char* kAllowed{name}[] = {{"
                       + ", ".join(c_string(v) for v in a.allowed) + "};")
        elif a.kind == "ints":  # default empty; the minimum of each, the most of them
            out.append(f"inline constexpr int64_t kMin{name} = {int(a.minimum)};")
            out.append(f"inline constexpr int kMax{name}Count = {int(a.maximum)};")
        elif a.kind == "int":
            out.append(f"inline constexpr int64_t kDefault{name} = {int(a.default)};")
            if a.minimum is not None:
                out.append(f"inline constexpr int64_t kMin{name} = {int(a.minimum)};")
            if a.maximum is not None:
                out.append(f"inline constexpr int64_t kMax{name} = {int(a.maximum)};")
        else:
            out.append(f"inline constexpr float kDefault{name} = {float(a.default)!r}f;")
    out.append("inline constexpr int kInplace[][2] = {"
               + ", ".join(f"{{{i}, {o}}}" for i, o in op.inplace) + "};")
    out.append(f"}}  // namespace {namespace}")
    return out


def render(c) -> str:
    lines = [
        "// Generated from onnx_hybrid/ops/contract.py by gen_contract_header.py. Do not edit.",
        "#pragma once",
        "#include <cstdint>",
        "",
        "namespace onnx_hybrid {",
        "namespace contract {",
        "",
        "enum class PortType { kActivation, kFloat, kInt32, kUint8, kGate };",
        "struct PortSpec { const char* name; PortType type; bool optional; bool host_memory; };",
        "struct UpdateRule { const char* name; bool has_decay; bool has_delta; };",
        "",
        f"inline constexpr char kDomain[] = {c_string(c.DOMAIN)};",
        f"inline constexpr char kMsDomain[] = {c_string(c.MS_DOMAIN)};",
        f"inline constexpr int kOpsetVersion = {c.OPSET_VERSION};",
        f"inline constexpr int kMaxStateUpdateCapacity = {c.MAX_STATE_UPDATE_CAPACITY};",
        f"inline constexpr int kSequentialMinTokens = {c.SEQUENTIAL_MIN_TOKENS};",
        f"inline constexpr float kL2NormEps = {c.L2_NORM_EPS!r}f;",
        f"inline constexpr float kSoftplusThreshold = {c.SOFTPLUS_THRESHOLD!r}f;",
        f"inline constexpr int64_t kInt32Max = {c.INT32_MAX};",
        "inline constexpr UpdateRule kUpdateRules[] = {",
        *(f"    {{{c_string(n)}, {str(d).lower()}, {str(r).lower()}}}," for n, (d, r) in c.UPDATE_RULES.items()),
        "};",
        "",
        *op_block(c, c.GATED_DELTA_NET, "gdn"),
        "",
        *op_block(c, c.VARLEN_CAUSAL_CONV, "conv"),
        "",
        *op_block(c, c.PAGED_ATTENTION, "paged"),
        "",
        *op_block(c, c.LINEAR, "linear"),
        "",
        *op_block(c, c.QUANTIZED_LINEAR, "qlinear"),
        f"inline constexpr int kQlinearBits = {c.QUANTIZED_LINEAR_BITS};",
        f"inline constexpr int kQlinearInt8Level = {c.QUANTIZED_LINEAR_INT8_LEVEL};",
        "",
        "// Rejection templates with positional fields {0}, {1}, ...; the op name and \": \" go in front.",
        "namespace msg {",
        *(f"inline constexpr char k{camel(key)}[] = {c_string(text)};" for key, text in c.MESSAGES.items()),
        "}  // namespace msg",
        "",
        "// Each template's name in contract.MESSAGES, which the library reports with a rejection (ContractError::key).",
        "struct MessageKey {",
        "  const char* templ;",
        "  const char* key;",
        "};",
        "inline constexpr MessageKey kMessageKeys[] = {",
        *(f"    {{msg::k{camel(key)}, {c_string(key)}}}," for key in c.MESSAGES),
        "};",
        "",
        "}  // namespace contract",
        "}  // namespace onnx_hybrid",
        "",
    ]
    return "\n".join(lines)


def main() -> int:
    sys.stdout.write(render(load_contract()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
