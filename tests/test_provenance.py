"""Provenance names the library's own code: its version, and a commit only from its checkout."""
import subprocess

from rltf_ray.provenance import ROOT, git_commit, package_version


def git(cwd, *args):
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, text=True).stdout.strip()


def test_a_package_inside_another_repository_records_no_commit(tmp_path):
    # a user's repository with the package installed in its .venv's site-packages
    git(tmp_path, "init", "-q")
    git(tmp_path, "-c", "user.email=a@b", "-c", "user.name=a", "commit", "-q", "--allow-empty", "-m", "user's")
    pkg_root = tmp_path / ".venv" / "lib" / "site-packages"
    pkg_root.mkdir(parents=True)
    assert git_commit(pkg_root) is None
    # the repository's own top level is a checkout: its commit is recorded
    assert git_commit(tmp_path) == git(tmp_path, "rev-parse", "HEAD")


def test_a_checkout_records_its_commit_with_dirty_and_the_version():
    commit = git_commit(ROOT)
    assert commit is not None and commit.split("-")[0] == git(ROOT, "rev-parse", "HEAD")
    assert commit.endswith("-dirty") == bool(git(ROOT, "status", "--porcelain", "--untracked-files=no"))
    from importlib.metadata import version
    assert package_version() == version("rltf_ray")
