# SPDX-License-Identifier: Apache-2.0
"""The package is installed for Debian's python3 and found without PYTHONPATH."""

import os
import subprocess

import ringloader as rl


def test_imports_from_a_fresh_process_without_pythonpath():
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    out = subprocess.run(["/usr/bin/python3", "-c", "import ringloader, sys; print(ringloader.__file__)"],
                         capture_output=True, text=True, env=env, cwd="/", timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().startswith("/usr/local/lib/python3"), out.stdout


def test_python3_on_path_imports_it_from_any_directory():
    """What a user types: `python3` as PATH finds it (Debian's, or a same-version pyenv/venv one
    that scripts/setup pointed at the package)."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    out = subprocess.run(["python3", "-c", "import ringloader"], capture_output=True, text=True,
                         env=env, cwd="/", timeout=60)
    assert out.returncode == 0, out.stderr


def test_daemon_binary_is_the_one_setup_installed_and_matches_the_package():
    """scripts/setup installs the binaries into /usr/local/bin next to the package under
    /usr/local/lib: find_binary must find that ringloaderd, and it must be this release's."""
    found = rl.find_binary("ringloaderd")
    assert found == "/usr/local/bin/ringloaderd"
    out = subprocess.run([found, "--version"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert rl.__version__ in out.stdout + out.stderr


def test_public_names_have_docstrings_and_the_package_is_typed():
    for name in rl.__all__:
        assert getattr(rl, name).__doc__, name
    assert os.path.exists(os.path.join(os.path.dirname(rl.__file__), "py.typed"))
