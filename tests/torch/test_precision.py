"""`--precision auto|fp32|bf16`: the flag parser on real /proc/cpuinfo text, the decision on given flag sets, the
deprecated --bf16/--no-bf16 alias, and the CLI errors."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from polymem.cli.app import app
from polymem.errors import PolymemError
from polymem.torch.precision import choose_precision, host_cpu_flags, parse_cpu_flags
from polymem.recipes.train import TrainConfig

X86 = """processor\t: 0
vendor_id\t: AuthenticAMD
model name\t: AMD EPYC 7B13
flags\t\t: fpu vme de pse tsc msr pae mce cx8 sse sse2 ssse3 fma sse4_1 sse4_2 avx f16c avx2 bmi2 sha_ni
bugs\t\t: sysret_ss_attrs spectre_v1

processor\t: 1
flags\t\t: fpu vme de pse tsc msr pae mce cx8 sse sse2 ssse3 fma sse4_1 sse4_2 avx f16c avx2 bmi2 sha_ni
"""
SAPPHIRE = "flags\t\t: avx2 avx512f avx512_bf16 amx_bf16 amx_tile amx_int8 avx512_fp16\n"
ARM = "processor\t: 0\nFeatures\t: fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics bf16 i8mm\n"


def test_parse_flags_x86_arm_and_this_machine():
    f = parse_cpu_flags(X86)
    assert {"avx2", "fma", "sha_ni"} <= f and "avx512f" not in f and "spectre_v1" not in f  # `bugs` is not flags
    assert "amx_bf16" in parse_cpu_flags(SAPPHIRE) and "bf16" in parse_cpu_flags(ARM)
    if Path("/proc/cpuinfo").exists():  # the real source on this machine: the same parser, a non-trivial set
        real = parse_cpu_flags(Path("/proc/cpuinfo").read_text())
        assert real == host_cpu_flags() and ("fpu" in real or "fp" in real)


@pytest.mark.parametrize("flags,expected", [
    ({"avx2", "fma"}, "fp32"),                                 # AVX2-only EPYC: bf16 emulated, 17x slower
    ({"avx2", "avx512f", "avx512_bf16"}, "fp32"),              # bf16 dot product but no matrix unit: 0.72x here
    ({"avx2", "avx512f", "avx512_bf16", "amx_bf16"}, "bf16"),  # AMX
    ({"fp", "asimd", "bf16"}, "fp32"),
    (None, "fp32"),                                             # unknown CPU
])
def test_auto_on_cpu(flags, expected):
    name, why = choose_precision("auto", "cpu", cpu_flags=flags)
    assert name == expected and why.startswith("auto: ")
    if flags and "amx_bf16" in flags:
        assert "amx_bf16" in why
    elif flags and "avx512_bf16" in flags:
        assert "no AMX" in why


def test_auto_on_cuda_and_overrides():
    assert choose_precision("auto", "cuda", cuda_bf16=True)[0] == "bf16"
    assert choose_precision("auto", "cuda", cuda_bf16=False)[0] == "fp32"
    assert choose_precision("fp32", "cpu", cpu_flags={"amx_bf16"})[0] == "fp32"
    name, why = choose_precision("bf16", "cpu", cpu_flags={"avx2"})
    assert name == "bf16" and "although" in why and "17x" in why  # forced, with the warning in the reason
    with pytest.raises(PolymemError, match="'fp16'.*auto, fp32, bf16"):
        choose_precision("fp16", "cpu", cpu_flags=set())


def test_train_config_precision_and_deprecated_bf16():
    assert TrainConfig(precision="fp32", device="cpu").precision_choice()[0] == "fp32"
    name, why = TrainConfig(bf16=True, device="cpu").precision_choice()
    assert name == "bf16" and "deprecated bf16=True" in why
    assert TrainConfig(bf16=False, precision="bf16", device="cpu").precision_choice()[0] == "fp32"  # the alias wins
    with pytest.raises(PolymemError, match="precision 'half' is unknown"):
        TrainConfig(precision="half")


def test_cli_choices_match_the_library():
    from polymem.cli._options import Precision
    from polymem.torch.precision import PRECISIONS

    assert tuple(p.value for p in Precision) == PRECISIONS


def test_cli_precision_errors_and_alias(tmp_path):
    runner = CliRunner()
    corpus = tmp_path / "c.txt"
    corpus.write_text("hello world\n" * 20)
    base = ["train", "--tokenizer", "bytes", "--corpus", str(corpus), "--out", str(tmp_path / "d.safetensors")]
    r = runner.invoke(app, [*base, "--precision", "fp16"])
    assert r.exit_code == 2 and "fp16" in r.output  # a usage error naming the value (choices: auto, fp32, bf16)
    r = runner.invoke(app, [*base, "--precision", "fp32", "--bf16"])
    assert r.exit_code != 0 and "contradicts --precision fp32" in str(r.exception)
