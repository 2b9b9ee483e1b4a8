#!/usr/bin/env python3
"""Compiles one of Tandem's kernel files with NVRTC for sm_90 (sm_90a for flash.cu; as the CUDA backend does: common.cuh
and the file's headers first, the same options) and disassembles it with nvdisasm: per kernel, its
SASS instruction count, global loads, and local-memory loads and stores (LDL/STL: a spilled
register, or an array indexed by a runtime value, which costs a memory round trip). No GPU needed.

    python3 scripts/kernel_sass.py mmvq.cu                # the table, every kernel
    python3 scripts/kernel_sass.py mmvq.cu mmvqp_q4_k     # kernels whose name starts with this
    python3 scripts/kernel_sass.py mmvq.cu mmvq_q4_k_u1_r1_s1 --sass   # and their SASS

NVRTC and nvdisasm come from PyPI (no CUDA toolkit needed):
    pip download --no-deps nvidia-cuda-nvrtc==13.0.88 nvidia-cuda-nvdisasm, unzip both wheels, then
    NVRTC_LIB=<dir>/nvidia/cu13/lib NVDISASM=<dir>/nvidia/cu13/bin/nvdisasm (chmod +x it).
"""
import ctypes
import os
import re
import subprocess
import sys
import tempfile

KERNELS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "crates", "tandem-cuda", "src", "kernels")
# The headers each file takes after common.cuh (crates/tandem-cuda/src/nvrtc.rs: `headers`).
HEADERS = {
    "mmvq.cu": ["int8.cuh"],
    "mmq.cu": ["int8.cuh"],
    "qmma.cu": ["int8.cuh"],
    "attention.cu": ["tiles.cuh"],
    "flash.cu": ["wgmma.cuh"],
}
# Files compiled for Hopper's arch-specific target (`KernelFile::arch_features`).
ARCH_FEATURES = {"flash.cu"}
# The backend's options (crates/tandem-cuda/src/nvrtc.rs: OPTIONS, then the architecture).
OPTIONS = [b"--std=c++17", b"--fmad=true"]


def compile_cubin(name):
    lib_dir = os.environ.get("NVRTC_LIB", os.path.expanduser("~/.cache/tandem/nvrtc-13.0.88/nvidia/cu13/lib"))
    # NVRTC loads its builtins library by name: preload it from the same folder.
    ctypes.CDLL(os.path.join(lib_dir, "libnvrtc-builtins.so.13.0"), mode=ctypes.RTLD_GLOBAL)
    lib = ctypes.CDLL(os.path.join(lib_dir, "libnvrtc.so.13"))
    # As `nvrtc::assemble`: common.cuh, the file's headers (`KernelFile::headers`), then the file.
    parts = ["common.cuh"] + HEADERS.get(name, []) + [name]
    src = "".join(f"// ---- {p} ----\n{open(os.path.join(KERNELS, p)).read()}\n" for p in parts).encode()
    prog = ctypes.c_void_p()
    if lib.nvrtcCreateProgram(ctypes.byref(prog), src, name.encode(), 0, None, None) != 0:
        sys.exit("nvrtcCreateProgram failed")
    arch = b"sm_90a" if name in ARCH_FEATURES else b"sm_90"
    options = OPTIONS + [b"--gpu-architecture=" + arch]
    opts = (ctypes.c_char_p * len(options))(*options)
    status = lib.nvrtcCompileProgram(prog, len(options), opts)
    size = ctypes.c_size_t()
    lib.nvrtcGetProgramLogSize(prog, ctypes.byref(size))
    log = ctypes.create_string_buffer(size.value)
    lib.nvrtcGetProgramLog(prog, log)
    if status != 0:
        sys.exit(f"{name} did not compile:\n{log.value.decode()}")
    lib.nvrtcGetCUBINSize(prog, ctypes.byref(size))
    cubin = ctypes.create_string_buffer(size.value)
    lib.nvrtcGetCUBIN(prog, cubin)
    return cubin.raw


def kernels_sass(cubin):
    nvdisasm = os.environ.get("NVDISASM", "nvdisasm")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        text = subprocess.run([nvdisasm, "-c", f.name], check=True, capture_output=True, text=True).stdout
    kernels, name = {}, None
    for line in text.splitlines():
        m = re.match(r"^\.text\.([A-Za-z0-9_]+):", line)
        if m:
            name = m.group(1)
            kernels[name] = []
        elif name and re.match(r"^\s+/\*[0-9a-f]{4,}\*/", line):
            kernels[name].append(re.sub(r"/\*[^*]*\*/", "", line).strip())
    return kernels


def main():
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    if not args:
        sys.exit(__doc__)
    prefix = args[1] if len(args) > 1 else ""
    show = "--sass" in sys.argv
    kernels = kernels_sass(compile_cubin(args[0]))
    print(f"| kernel | instructions | global loads | local loads/stores |\n|---|---:|---:|---:|")
    for name, sass in sorted(kernels.items()):
        if not name.startswith(prefix) or name.startswith("$"):
            continue
        ops = [s.split()[1] if s.startswith("@") else s.split()[0] for s in sass if s]
        count = lambda p: sum(1 for o in ops if o.startswith(p))
        print(f"| {name} | {len(sass)} | {count('LDG')} | {count('LDL') + count('STL')} |")
        if show:
            print("\n".join(sass))


if __name__ == "__main__":
    main()
