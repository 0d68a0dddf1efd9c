"""benchmarks/ceiling.cpu_description: the CPU and its widest vector ISA, read from /proc/cpuinfo's text."""
from benchmarks import ceiling

_ZEN4 = """processor\t: 0
vendor_id\t: AuthenticAMD
cpu family\t: 25
model\t\t: 17
model name\t: AMD EPYC 9B14
flags\t\t: fpu sse sse2 avx fma avx2 avx512f avx512dq avx512_bf16 avx512_vnni

processor\t: 1
vendor_id\t: AuthenticAMD
cpu family\t: 25
model\t\t: 17
model name\t: AMD EPYC 9B14
flags\t\t: fpu sse sse2 avx fma avx2 avx512f avx512dq avx512_bf16 avx512_vnni
"""
_ZEN3 = "processor\t: 0\nmodel name\t: AMD EPYC 7B13\nflags\t\t: fpu sse avx fma avx2\n"
_GRAVITON = "processor\t: 0\nBogoMIPS\t: 243.75\nFeatures\t: fp asimd evtstrm aes sve\n\nprocessor\t: 1\n"


def test_names_the_model_the_cores_and_the_widest_vector_isa():
  assert ceiling.cpu_description(_ZEN4) == "AMD EPYC 9B14 (family 25, model 17), 2 cores, AVX-512 with bf16"
  assert ceiling.cpu_description(_ZEN3) == "AMD EPYC 7B13, 1 core, AVX2 with FMA"
  without_bf16 = _ZEN4.replace(" avx512_bf16", "")
  assert ceiling.cpu_description(without_bf16) == "AMD EPYC 9B14 (family 25, model 17), 2 cores, AVX-512"


def test_arm_hosts_without_a_model_name_fall_back_to_the_machine():
  text = ceiling.cpu_description(_GRAVITON)
  assert text.endswith(", 2 cores, SVE")

