"""The documentation site (mkdocs.yml, docs/): MkDocs with Material builds it in strict mode, where a link to a
missing page or a missing anchor fails the build, so a stale reference fails CI; and the README starts with use."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
MKDOCS = Path(sys.executable).parent / "mkdocs"


def build(root: Path, site: Path) -> subprocess.CompletedProcess[str]:
    if not MKDOCS.exists():
        pytest.fail(f"{MKDOCS} not found: install the docs extra (pip install -e '.[docs]'; make test does)")
    return subprocess.run([str(MKDOCS), "build", "--strict", "--config-file", str(root / "mkdocs.yml"),
                           "--site-dir", str(site)], cwd=root, capture_output=True, text=True, timeout=300,
                          env={"PATH": "/usr/bin:/bin", "NO_MKDOCS_2_WARNING": "1", "HOME": str(site.parent)})


def copy_site_sources(tmp_path: Path) -> Path:
    root = tmp_path / "repo"
    shutil.copytree(REPO / "docs", root / "docs")
    shutil.copy(REPO / "mkdocs.yml", root / "mkdocs.yml")
    return root


def test_the_site_builds_strict(tmp_path: Path) -> None:
    out = build(REPO, tmp_path / "site")
    assert out.returncode == 0, out.stderr
    assert (tmp_path / "site" / "benchmarks" / "index.html").is_file()
    assert (tmp_path / "site" / "kubernetes" / "index.html").is_file()


BROKEN_LINKS = {"[gone](no-such-page.md)": "contains a link 'no-such-page.md', but the target is not found",
                "[stale](kubernetes.md#no-such-section)": "does not contain an anchor '#no-such-section'"}


def test_each_broken_link_fails_the_build_named(tmp_path: Path) -> None:
    """One build of a page with a link to a missing page and one to a missing anchor: each is named (strict mode
    says every warning, then fails)."""
    root = copy_site_sources(tmp_path)
    page = root / "docs" / "faults.md"
    page.write_text(page.read_text() + "".join(f"\nSee {link}.\n" for link in BROKEN_LINKS))
    out = build(root, tmp_path / "site")
    assert out.returncode != 0 and all(message in out.stderr for message in BROKEN_LINKS.values()), out.stderr


def test_every_page_is_in_the_nav_and_benchmarks_keep_their_markers() -> None:
    """A page left out of the nav is a warning (strict: an error); docs/benchmarks.md is written section by
    section by `dppo bench ... --write-docs` and must keep its title and markers."""
    config = yaml.load((REPO / "mkdocs.yml").read_text(), Loader=yaml.Loader)  # mkdocs' !!python tags
    nav = re.findall(r"[\w-]+\.md", str(config["nav"]))
    assert sorted(nav) == sorted(p.name for p in (REPO / "docs").glob("*.md"))
    text = (REPO / "docs" / "benchmarks.md").read_text()
    begins = re.findall(r"^<!-- dppo-bench:([\w.-]+):begin -->$", text, re.M)
    ends = re.findall(r"^<!-- dppo-bench:([\w.-]+):end -->$", text, re.M)
    assert text.startswith("# Benchmarks\n") and begins == ends and len(begins) > 10


def test_the_presets_page_names_every_preset() -> None:
    presets = {p.relative_to(REPO / "dppo" / "presets").as_posix() for p in (REPO / "dppo" / "presets").rglob("*.yaml")}
    assert len(presets) >= 11
    page = (REPO / "docs" / "configuration.md").read_text()
    assert {p for p in presets if f"`{p}`" not in page} == set()
    readme = (REPO / "README.md").read_text()
    for path in (REPO / "dppo" / "presets").glob("*.yaml"):
        env_id = yaml.safe_load(path.read_text())["env"]["id"]
        assert f"`{env_id}`" in readme, f"the README's presets line misses {env_id}"


def test_the_readme_starts_with_use() -> None:
    """What dppo is, install (make demo and make test), train, the chart with how to get helm, a figure; then
    pointers to the docs pages, every one of which exists."""
    readme = (REPO / "README.md").read_text()
    headings = re.findall(r"^## (.+)$", readme, re.M)
    assert headings[:3] == ["Install", "Train", "On Kubernetes"]
    install = readme.split("## Install", 1)[1].split("\n## ", 1)[0]
    assert "make demo" in install and "make test" in install and "apt-get" not in install
    assert "make tools" in readme.split("## On Kubernetes", 1)[1].split("\n## ", 1)[0]
    figure = re.search(r"!\[[^\]]*\]\((docs/[^)]+\.png)\)", readme)
    assert figure and (REPO / figure.group(1)).is_file()
    for target in re.findall(r"\]\((docs/[^)#]+)", readme):
        assert (REPO / target).is_file(), target
    assert len(readme.splitlines()) < 150


# How the docs give the suite's measured time (a line break, and a comment's `#`, may come before the minutes).
SUITE_TIME = re.compile(r"([\d,]+) s of pytest\s+(?:#\s*)?\((\d+) min\)")


def test_the_suite_s_time_is_one_measured_figure_wherever_it_is_given() -> None:
    """docs/install.md is its source (with the command and the commit it was measured on); the README and the
    Makefile say the same figure, in seconds and whole minutes."""
    install = SUITE_TIME.findall((REPO / "docs" / "install.md").read_text())
    assert install, "docs/install.md gives no 'N s of pytest (M min)'"
    seconds = {int(s.replace(",", "")) for s, _ in install}
    assert len(seconds) == 1, install
    (figure,) = seconds
    for path in ("README.md", "Makefile"):
        said = SUITE_TIME.findall((REPO / path).read_text())
        assert said, f"{path} gives no 'N s of pytest (M min)'"
        assert {(int(s.replace(",", "")), int(m)) for s, m in said} == {(figure, round(figure / 60))}, (path, said)
