"""Installs the build tree into a temporary prefix (cmake --install) and builds
examples/embed.c against it twice, with find_package(loradb) and with pkg-config, then runs it."""
import os
import shutil
import subprocess
import sys
import tempfile


def run(cmd, **kw):
    print("+", " ".join(cmd), flush=True)
    return subprocess.run(cmd, check=True, **kw)


def main():
    build_dir, source_dir = sys.argv[1], sys.argv[2]
    with tempfile.TemporaryDirectory(prefix="loradb-install-") as tmp:
        prefix = os.path.join(tmp, "prefix")
        run(["cmake", "--install", build_dir, "--prefix", prefix])
        libdir = next(os.path.join(prefix, d) for d in ("lib", "lib64",
                                                         "lib/x86_64-linux-gnu")
                      if os.path.exists(os.path.join(prefix, d, "pkgconfig", "loradb.pc")))
        for f in ("include/loradb.h",):
            assert os.path.exists(os.path.join(prefix, f)), f
        assert os.path.exists(os.path.join(libdir, "cmake", "loradb", "loradbConfig.cmake"))
        env = dict(os.environ, LD_LIBRARY_PATH=libdir)
        # 1) CMake package.
        ex_build = os.path.join(tmp, "build-ex")
        run(["cmake", "-S", os.path.join(source_dir, "examples"), "-B", ex_build,
             "-DCMAKE_PREFIX_PATH=" + prefix])
        run(["cmake", "--build", ex_build])
        store = os.path.join(tmp, "store")
        out = run([os.path.join(ex_build, "embed"), store], env=env, capture_output=True,
                  text=True).stdout
        print(out)
        assert "published revision" in out and "serving -> revision" in out, out
        # 2) pkg-config, plain cc, compiled as C11.
        pc = subprocess.run(["pkg-config", "--cflags", "--libs", "loradb"], check=True,
                            capture_output=True, text=True,
                            env=dict(os.environ, PKG_CONFIG_PATH=os.path.join(libdir, "pkgconfig"))
                            ).stdout.split()
        exe = os.path.join(tmp, "embed-pc")
        cc = shutil.which("cc") or "gcc"
        run([cc, "-std=c11", "-Wall", "-Wextra", "-Werror", "-pedantic",
             os.path.join(source_dir, "examples", "embed.c"), "-o", exe] + pc)
        out = run([exe, store], env=env, capture_output=True, text=True).stdout
        assert "seq 2" in out, out  # second run, same store: a second revision
    print("install + embed test passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
