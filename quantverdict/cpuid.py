"""The x86-64 CPUID instruction, executed by this process: the instruction sets it can run, as the CPU (or an
emulator such as QEMU, or a hypervisor) reports them to it. ``/proc/cpuinfo`` shows the host's flags
instead, so under an emulator it names instructions the process cannot execute. NumPy probes the
AVX/AVX-512 flags this way; AVX-VNNI and AMX, which it does not probe, are read here."""
from __future__ import annotations

import ctypes
import functools
import mmap
import platform
import sys

# void cpuid(uint32 leaf [edi], uint32 subleaf [esi], uint32 out[4] [rdx]) in the System V AMD64 ABI:
# push rbx; mov eax, edi; mov ecx, esi; mov r8, rdx; cpuid; mov [r8], eax; mov [r8+4], ebx;
# mov [r8+8], ecx; mov [r8+12], edx; pop rbx; ret
_CODE = bytes([0x53, 0x89, 0xF8, 0x89, 0xF1, 0x49, 0x89, 0xD0, 0x0F, 0xA2, 0x41, 0x89, 0x00, 0x41, 0x89, 0x58,
               0x04, 0x41, 0x89, 0x48, 0x08, 0x41, 0x89, 0x50, 0x0C, 0x5B, 0xC3])

# flag → (leaf, subleaf, register index in eax/ebx/ecx/edx, bit)
FLAGS = {"avx_vnni": (7, 1, 0, 4), "amx_bf16": (7, 0, 3, 22), "amx_int8": (7, 0, 3, 25)}


@functools.lru_cache(maxsize=1)
def _instruction() -> ctypes._CFuncPtr | None:  # type: ignore[name-defined]
    if sys.platform != "linux" or platform.machine() not in ("x86_64", "AMD64"):
        return None
    try:  # a kernel that refuses executable anonymous memory leaves /proc/cpuinfo to the caller
        page = mmap.mmap(-1, mmap.PAGESIZE, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)
    except (OSError, ValueError, AttributeError):
        return None
    page.write(_CODE)
    start = ctypes.c_char.from_buffer(page)
    instruction = ctypes.CFUNCTYPE(None, ctypes.c_uint32, ctypes.c_uint32,
                                   ctypes.POINTER(ctypes.c_uint32))(ctypes.addressof(start))
    instruction.page = start  # type: ignore[attr-defined]  # keeps the mapped page alive (start holds it)
    return instruction


def cpuid_flags() -> dict[str, bool] | None:
    """Each of :data:`FLAGS` as CPUID reports it to this process, or None where CPUID cannot be run here."""
    instruction = _instruction()
    if instruction is None:
        return None
    registers = (ctypes.c_uint32 * 4)()
    instruction(0, 0, registers)
    highest = registers[0]
    flags = {}
    for flag, (leaf, subleaf, register, bit) in FLAGS.items():
        if leaf > highest:
            flags[flag] = False
            continue
        instruction(leaf, subleaf, registers)
        flags[flag] = bool(registers[register] >> bit & 1)
    return flags
