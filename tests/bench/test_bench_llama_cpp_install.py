"""scripts/install_llama_cpp.sh: its symlink step (scripts/llama_cpp_symlinks.py) on fake `_symlinks.json`
manifests; the instruction sets it builds with (scripts/llama_cpp_build.py) from sample /proc/cpuinfo texts,
its smoke check and its fall-back to safer sets on fake builds and fake servers (one killing itself with
SIGILL); and the script itself when the server is already built, was built the old way, dies, or cannot be built."""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPTS = Path(__file__).parents[2] / "scripts"
spec = importlib.util.spec_from_file_location("llama_cpp_symlinks", SCRIPTS / "llama_cpp_symlinks.py")
assert spec and spec.loader
symlinks = importlib.util.module_from_spec(spec)
spec.loader.exec_module(symlinks)
bspec = importlib.util.spec_from_file_location("llama_cpp_build", SCRIPTS / "llama_cpp_build.py")
assert bspec and bspec.loader
build = importlib.util.module_from_spec(bspec)
sys.modules["llama_cpp_build"] = build  # its dataclasses look their module up
bspec.loader.exec_module(build)


def wheel_bin(tmp_path: Path, links: dict) -> Path:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "llama-server").write_text("")
    (bin_dir / "libggml.so.0.9.4").write_text("the library")
    (bin_dir / "_symlinks.json").write_text(json.dumps(links))
    return bin_dir


def test_chained_links_are_made_in_any_order_and_a_second_run_changes_nothing(tmp_path):
    bin_dir = wheel_bin(tmp_path, {"libggml.so": "libggml.so.0", "libggml.so.0": "libggml.so.0.9.4"})
    assert sorted(symlinks.create_symlinks(bin_dir)) == ["libggml.so", "libggml.so.0"]
    assert os.readlink(bin_dir / "libggml.so") == "libggml.so.0"  # relative: the bin dir can move
    assert (bin_dir / "libggml.so").read_text() == "the library"
    assert symlinks.create_symlinks(bin_dir) == []


def test_a_stale_file_or_wrong_link_is_replaced(tmp_path):
    bin_dir = wheel_bin(tmp_path, {"libggml.so.0": "libggml.so.0.9.4", "libggml.so": "libggml.so.0"})
    (bin_dir / "libggml.so.0").write_text("a copy, not a link")
    (bin_dir / "libggml.so").symlink_to("elsewhere")
    assert sorted(symlinks.create_symlinks(bin_dir)) == ["libggml.so", "libggml.so.0"]
    assert os.readlink(bin_dir / "libggml.so.0") == "libggml.so.0.9.4"


def test_no_manifest_means_nothing_to_do(tmp_path):
    assert symlinks.create_symlinks(tmp_path) == []


@pytest.mark.parametrize("links", [{"libx.so": "../outside"}, {"../libx.so": "libggml.so.0.9.4"}, {"libx.so": "/abs"}])
def test_a_link_leaving_the_bin_dir_is_refused(tmp_path, links):
    bin_dir = wheel_bin(tmp_path, links)
    with pytest.raises(symlinks.SymlinkError, match="plain file name"):
        symlinks.create_symlinks(bin_dir)
    assert not (tmp_path / "outside").exists()


def test_a_link_to_a_missing_library_is_an_error_and_the_cli_exits_non_zero(tmp_path):
    bin_dir = wheel_bin(tmp_path, {"libllama.so.0": "libllama.so.0.0.1"})
    with pytest.raises(symlinks.SymlinkError, match=r"libllama.so.0 -> libllama.so.0.0.1"):
        symlinks.create_symlinks(bin_dir)
    cli = [sys.executable, str(SCRIPTS / "llama_cpp_symlinks.py"), str(bin_dir)]
    done = subprocess.run(cli, capture_output=True, text=True)
    assert done.returncode == 1 and "do not exist" in done.stderr


# Sample /proc/cpuinfo texts (two processors each; only the lines the script reads matter).
BASE = "fpu sse sse2 ssse3 sse4_1 sse4_2 popcnt aes xsave avx hypervisor"
ZEN2 = f"{BASE} fma f16c bmi1 bmi2 avx2"
ZEN4 = f"{ZEN2} avx512f avx512dq avx512cd avx512bw avx512vl avx512vbmi avx512_vnni avx512_bf16"
SAPPHIRE_RAPIDS_VM = f"{ZEN4} avx_vnni avx512_fp16 amx_bf16 amx_tile amx_int8"
SANDY_BRIDGE = BASE


def cpuinfo(flags: str, model: str = "Some CPU", cpus: int = 2, other_flags: str | None = None) -> str:
    blocks = []
    for i in range(cpus):
        f = other_flags if other_flags is not None and i == cpus - 1 else flags
        blocks.append(f"processor\t: {i}\nmodel name\t: {model}\nflags\t\t: {f}\n")
    return "\n".join(blocks)


def tier_names(text: str, machine: str = "x86_64", allow_amx: bool = False) -> list[str]:
    return [t.name for t in build.tiers(build.cpu_flags(text), machine, allow_amx)]


def options(tier) -> dict[str, str]:
    return dict(a.removeprefix("-D").split("=") for a in tier.cmake_args())


@pytest.mark.parametrize(
    ("flags", "amx", "names"),
    [
        (ZEN2, False, ["avx2", "baseline"]),
        (ZEN4, False, ["avx512", "avx2", "baseline"]),
        (SAPPHIRE_RAPIDS_VM, False, ["avx512", "avx2", "baseline"]),  # AMX reported, never used unasked
        (SAPPHIRE_RAPIDS_VM, True, ["avx512-amx", "avx512", "avx2", "baseline"]),
        (ZEN4, True, ["avx512", "avx2", "baseline"]),  # opted in, but no AMX to use
        (SANDY_BRIDGE, False, ["baseline"]),
    ],
)
def test_tiers_from_cpuinfo(flags, amx, names):
    assert tier_names(cpuinfo(flags), allow_amx=amx) == names


def test_every_x86_tier_is_non_native_with_each_option_set_explicitly():
    for tier in build.tiers(build.cpu_flags(cpuinfo(SAPPHIRE_RAPIDS_VM)), "x86_64", allow_amx=True):
        opts = options(tier)
        assert opts["GGML_NATIVE"] == "OFF"
        assert set(opts) == {"GGML_NATIVE", *(f"GGML_{o}" for o in build.X86_OPTIONS)}
    top, avx512, avx2, base = build.tiers(build.cpu_flags(cpuinfo(SAPPHIRE_RAPIDS_VM)), "x86_64", allow_amx=True)
    assert [options(top)[f"GGML_AMX_{k}"] for k in ("TILE", "INT8", "BF16")] == ["ON"] * 3
    on = {k for k, v in options(avx512).items() if v == "ON"}
    assert on == {f"GGML_{o}" for o in build.AVX512_SET}  # AVX-VNNI, VBMI, VNNI, BF16 as reported; no AMX
    assert {k for k, v in options(avx2).items() if v == "ON"} == {f"GGML_{o}" for o in build.AVX2_SET}
    assert {k for k, v in options(base).items() if v == "ON"} == {"GGML_SSE42"}


def test_zen4_gets_the_avx512_extensions_it_reports_and_no_avx_vnni():
    avx512 = build.tiers(build.cpu_flags(cpuinfo(ZEN4)))[0]
    assert options(avx512)["GGML_AVX512_BF16"] == "ON" and options(avx512)["GGML_AVX512_VNNI"] == "ON"
    assert options(avx512)["GGML_AVX_VNNI"] == "OFF" and options(avx512)["GGML_AMX_TILE"] == "OFF"


def test_a_flag_one_processor_lacks_is_not_used():
    # a VM whose vCPUs differ: only what every processor reports counts
    assert tier_names(cpuinfo(ZEN4, other_flags=ZEN2)) == ["avx2", "baseline"]
    assert tier_names(cpuinfo(ZEN4.replace(" avx512bw", ""))) == ["avx2", "baseline"]  # AVX512 needs F/CD/VL/DQ/BW


def test_other_architectures_try_native_then_generic():
    arm = "processor\t: 0\nFeatures\t: fp asimd aes sha2 crc32 atomics asimddp sve\n"
    tiers = build.tiers(build.cpu_flags(arm), "aarch64")
    assert [t.name for t in tiers] == ["native", "generic"]
    assert tiers[0].cmake_args() == ["-DGGML_NATIVE=ON"] and tiers[1].cmake_args() == ["-DGGML_NATIVE=OFF"]


def test_the_tiers_cli_reads_a_cpuinfo_file(tmp_path):
    (tmp_path / "cpuinfo").write_text(cpuinfo(ZEN2))
    cli = [sys.executable, str(SCRIPTS / "llama_cpp_build.py"), "tiers", "--cpuinfo", str(tmp_path / "cpuinfo")]
    out = subprocess.run(cli, capture_output=True, text=True, check=True).stdout.splitlines()
    if os.uname().machine == "x86_64":
        assert [line.split("\t")[0] for line in out] == ["avx2", "baseline"]
        assert "-DGGML_NATIVE=OFF" in out[0] and "-DGGML_AVX2=ON" in out[0]


SIGILL = build.Smoke(False, "killed by SIGILL (Illegal instruction)", signal.SIGILL)


def run_fallback(smokes: list, tiers=None):
    tiers = tiers or build.tiers(build.cpu_flags(cpuinfo(SAPPHIRE_RAPIDS_VM)), "x86_64", allow_amx=True)
    built, said = [], []
    results = iter(smokes)
    out = build.build_with_fallback(tiers, lambda t: built.append(t.name), lambda: next(results), said.append)
    return out, built, said


def test_the_first_tier_that_runs_is_kept():
    (tier, result, given_up), built, _ = run_fallback([build.Smoke(True, "1 token")])
    assert tier.name == "avx512-amx" and built == ["avx512-amx"] and given_up == [] and result.ok


def test_a_server_killed_by_sigill_is_rebuilt_with_safer_flags_and_it_says_so():
    (tier, _, given_up), built, said = run_fallback([SIGILL, SIGILL, build.Smoke(True, "1 token")])
    assert built == ["avx512-amx", "avx512", "avx2"] and tier.name == "avx2"
    assert len(given_up) == 2 and "avx512-amx" in given_up[0] and "SIGILL" in given_up[0]
    assert any("tier avx512 was killed by SIGILL (Illegal instruction); rebuilding with the safer tier avx2" in s
               for s in said)  # fmt: skip


def test_a_failure_without_a_signal_stops_instead_of_rebuilding():
    with pytest.raises(build.BuildError, match="fails its smoke check: exited with 1"):
        run_fallback([build.Smoke(False, "exited with 1: no such model")])


def test_a_build_error_stops():
    def failing(tier):
        raise build.BuildError("pip install failed")

    with pytest.raises(build.BuildError, match="pip install failed"):
        build.build_with_fallback(build.tiers(build.cpu_flags(cpuinfo(ZEN2))), failing, lambda: SIGILL, print)


def test_every_tier_dying_is_an_error_naming_each():
    tiers = build.tiers(build.cpu_flags(cpuinfo(ZEN2)))
    with pytest.raises(build.BuildError, match=r"every tier.*avx2 .*SIGILL.*baseline .*SIGILL"):
        run_fallback([SIGILL, SIGILL], tiers)


def test_the_recorded_flags_say_what_passed(tmp_path):
    tier = build.tiers(build.cpu_flags(cpuinfo(ZEN4)))[1]
    text = build.flags_text(tier, build.Smoke(True, "1 token"), ["avx512 (...): killed by SIGILL"], "1.0", "",
                            cpuinfo(ZEN4, model="AMD EPYC 9B14"))  # fmt: skip
    fields = dict(line.split(": ", 1) for line in text.splitlines())
    assert fields["tier"] == "avx2" and fields["cpu"] == "AMD EPYC 9B14" and "SIGILL" in fields["given up"]
    assert "-DGGML_NATIVE=OFF" in fields["cmake"] and fields["isa"] == "SSE42 AVX F16C FMA BMI2 AVX2"


FAKE_LLAMA_SERVER = """#!{python}
import http.server, json, sys
if "--version" in sys.argv:
    print("version: 1 (fake)")
    sys.exit(0)
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200 if self.path == "/health" else 404)
        self.end_headers()
    def do_POST(self):
        self.rfile.read(int(self.headers["Content-Length"]))
        data = json.dumps({{"content": " hi"}}).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)
port = int(sys.argv[sys.argv.index("--port") + 1])
http.server.HTTPServer(("127.0.0.1", port), H).serve_forever()
"""
SIGILL_SERVER = '#!/bin/sh\nif [ "$1" = "--version" ]; then echo "version: 1 (fake)"; exit 0; fi\nkill -ILL $$\n'


def write_exe(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(0o755)
    return path


def test_smoke_check_of_a_server_that_loads_and_generates(tmp_path):
    server = write_exe(tmp_path / "llama-server", FAKE_LLAMA_SERVER.format(python=sys.executable))
    result = build.smoke_check(server, "/m.gguf", tmp_path / "smoke.log", timeout_s=30)
    assert result.ok and "generated 1 token" in result.detail


def test_smoke_check_of_a_server_killed_by_sigill(tmp_path):
    server = write_exe(tmp_path / "llama-server", SIGILL_SERVER)
    result = build.smoke_check(server, "/m.gguf", tmp_path / "smoke.log", timeout_s=30)
    assert not result.ok and result.signal == signal.SIGILL
    assert result.detail == "killed by SIGILL (Illegal instruction)"
    cli = [sys.executable, str(SCRIPTS / "llama_cpp_build.py"), "smoke", "--server", str(server), "--model", "/m"]
    done = subprocess.run(cli, capture_output=True, text=True)
    assert done.returncode == 128 + signal.SIGILL and "SIGILL" in done.stdout


def test_smoke_check_without_a_model_runs_version_only(tmp_path):
    server = write_exe(tmp_path / "llama-server", SIGILL_SERVER)  # --version works
    result = build.smoke_check(server, None, tmp_path / "smoke.log")
    assert result.ok and "--version only" in result.detail


def fake_server(cache: Path, version_rc: int = 0, text: str | None = None, tier: str | None = None) -> None:
    server = cache / "llama.cpp" / "llama-server"
    write_exe(server, text or f"#!/bin/sh\necho 'version: 1 (fake)'\nexit {version_rc}\n")
    if tier:
        (server.parent / "build-flags.txt").write_text(f"tier: {tier}\nisa: AVX2\n")


def install(cache: Path, **env: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "FLUIDPD_CACHE": str(cache), "LLAMA_CPP_SMOKE_MODEL": "/m.gguf", **env}
    return subprocess.run(["bash", str(SCRIPTS / "install_llama_cpp.sh")], capture_output=True, text=True, env=env)


def test_install_does_nothing_when_the_server_passes_its_smoke_check(tmp_path):
    fake_server(tmp_path, text=FAKE_LLAMA_SERVER.format(python=sys.executable), tier="avx2")
    done = install(tmp_path, PYTHON="/nonexistent/python")  # would fail if it tried to build
    assert done.returncode == 0, done.stderr
    assert f"already built: {tmp_path}/llama.cpp/llama-server (tier: avx2; smoke check: loaded" in done.stdout
    assert not (tmp_path / "llama.cpp" / "venv").exists()


def test_install_rebuilds_a_server_built_natively_by_the_old_script(tmp_path):
    fake_server(tmp_path, text=FAKE_LLAMA_SERVER.format(python=sys.executable))  # runs, but no build-flags.txt
    done = install(tmp_path, PYTHON="/nonexistent/python")
    assert "has no" in done.stdout and "-march=native" in done.stdout and "rebuilding" in done.stdout
    assert done.returncode != 0 and "cannot create a venv" in done.stderr


def test_install_rebuilds_a_server_killed_by_sigill_here(tmp_path):
    fake_server(tmp_path, text=SIGILL_SERVER, tier="avx512")
    done = install(tmp_path, PYTHON="/nonexistent/python")
    assert "(tier avx512) fails its smoke check here: killed by SIGILL (Illegal instruction): rebuilding" in done.stdout
    assert done.returncode != 0 and "cannot create a venv" in done.stderr


def test_install_failing_early_says_why_and_exits_non_zero(tmp_path):
    fake_server(tmp_path, version_rc=1)  # built but broken: the script rebuilds, and here cannot
    done = install(tmp_path, PYTHON="/nonexistent/python")
    assert done.returncode != 0
    assert "install_llama_cpp: error: cannot create a venv with /nonexistent/python" in done.stderr


def test_build_with_every_tier_skipped_says_so(tmp_path):
    names = [line.split("\t")[0] for line in build_cli("tiers").stdout.splitlines()]
    done = build_cli("build", "--root", str(tmp_path), "--version", "0", *(f"--skip={n}" for n in names))
    assert done.returncode == 1 and "no tier left to try" in done.stderr


def build_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPTS / "llama_cpp_build.py"), *args], capture_output=True, text=True)
