"""``python -m lightning_adv report``: one self-contained HTML page built from a real run
directory (a short fit), opened in headless Chromium."""

import base64
import io
import os
import re
from html.parser import HTMLParser

import pytest
from matplotlib import image as mpimg
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from lightning_adv.cli import main
from lightning_adv.testing.browser import find_browser, render_page
from tests.support.cli_runs import fit
from tests.support.peers import unavailable

HEATMAP_TAGS = ["train/advantage_heatmap", "train/advantage_heatmap_raw",
                "val/advantage_heatmap", "val/advantage_heatmap_raw"]


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    """A real run: 3 steps of the multi-turn critic config, heatmaps at steps 0 and 2."""
    root = tmp_path_factory.mktemp("runs")
    fit("turn_gae", root, "--trainer.limit_train_batches=3", "--model.sample_log.every_n_steps=2")
    return root / "turn_gae" / "version_0"


@pytest.fixture(scope="module")
def report(run_dir):
    main(["report", str(run_dir)])
    return run_dir / "report.html"


class Links(HTMLParser):
    """Every URL-valued attribute, every tag."""

    def __init__(self):
        super().__init__()
        self.urls, self.tags, self.images = [], [], []

    def handle_starttag(self, tag, attrs):
        self.tags.append(tag)
        for name, value in attrs:
            if name in ("src", "href", "srcset", "data", "action", "poster"):
                self.urls.append(value)
        if tag == "img":
            self.images.append(dict(attrs))


def parsed(path):
    links = Links()
    links.feed(path.read_text())
    return links


def png_of(data_uri):
    assert data_uri.startswith("data:image/png;base64,")
    return base64.b64decode(data_uri.split(",", 1)[1])


def test_the_report_is_one_self_contained_page_with_every_section(report, run_dir):
    page = report.read_text()
    links = parsed(report)
    # nothing to fetch at view time: data URIs and in-page anchors only, no script, and a
    # content security policy that forbids any other load
    assert all(u.startswith(("data:image/png;base64,", "#")) for u in links.urls), links.urls
    assert "script" not in links.tags and "link" not in links.tags and "iframe" not in links.tags
    assert "default-src 'none'; img-src data:" in page
    assert not re.search(r"url\(|@import|https?://", page.split("<body>")[0])  # in the style
    alts = [img["alt"] for img in links.images]
    for curve in ("Reward", "KL", "Entropy", "Advantages", "Advantages before normalization"):
        assert curve in alts
    assert [a for a in alts if "heatmap" in a] == HEATMAP_TAGS
    for section in ("Summary", "Curves", "Evaluation", "Latest advantage heatmaps", "Config"):
        assert f"<h2>{section}</h2>" in page
    assert "<th>val/reward_greedy</th>" in page and "<th>val/pass@1</th>" in page
    config = (run_dir / "config.yaml").read_text()
    assert "estimator:" in config and "turn_gae" in config
    assert "implementation: turn_gae" in page  # the saved config, as text
    assert "3 (steps 0 to 2)" in page


def test_the_report_holds_the_latest_heatmaps_as_logged(report, run_dir):
    events = EventAccumulator(str(run_dir), size_guidance={"images": 0})
    events.Reload()
    shown = {img["alt"]: png_of(img["src"]) for img in parsed(report).images}
    for tag in HEATMAP_TAGS:
        latest = max(events.Images(tag), key=lambda e: e.step)
        assert shown[tag] == latest.encoded_image_string, tag
    assert "train/advantage_heatmap, step 2" in report.read_text()
    curve = mpimg.imread(io.BytesIO(shown["Reward"]), format="png")
    assert curve.shape[0] > 200 and curve[..., :3].std() > 0.05  # a drawn curve, not blank


def need_browser() -> None:
    """Skip without a browser, except in CI (LIGHTNING_ADV_REQUIRE_BROWSER=1), where a
    missing browser is a failure: there a skip would hide an untested page."""
    if find_browser() is not None:
        return
    unavailable("no Chromium-family browser on PATH (CI installs chromium in .ci/run)",
                env="LIGHTNING_ADV_REQUIRE_BROWSER")


def test_the_report_renders_in_headless_chromium(report):
    need_browser()
    rendered = render_page(report, width=1200)
    assert rendered.console_errors == []
    assert rendered.images == len(parsed(report).images) >= 9 and rendered.broken_images == 0
    assert "<h1>Run report: turn_gae/version_0</h1>" in rendered.dom
    shot = mpimg.imread(io.BytesIO(rendered.screenshot), format="png")[..., :3]
    assert shot.shape[1] == 1200 and shot.shape[0] > 2000  # the whole page, not one screen
    assert shot.std() > 0.1                                 # not blank
    rows = shot.reshape(shot.shape[0], -1).std(axis=1)
    assert (rows > 0.05).mean() > 0.3                       # content down the page


def test_the_browser_check_sees_console_errors_and_broken_images(tmp_path):
    need_browser()
    page = tmp_path / "bad.html"
    page.write_text('<html><body><img src="missing.png"><script>console.error("logged");'
                    'throw new Error("thrown")</script></body></html>')
    rendered = render_page(page)
    assert rendered.images == 1 and rendered.broken_images == 1
    assert any("ERR_FILE_NOT_FOUND" in e for e in rendered.console_errors)
    assert "logged" in rendered.console_errors
    assert any("Error: thrown" in e for e in rendered.console_errors)


def test_a_report_is_replaced_by_the_next_one_but_no_other_file(report, run_dir, capsys, tmp_path):
    main(["report", str(run_dir)])  # the earlier report is replaced
    assert "report: wrote" in capsys.readouterr().out
    mine = tmp_path / "notes.html"
    mine.write_text("my notes")
    with pytest.raises(SystemExit) as exit_info:
        main(["report", str(run_dir), "--out", str(mine)])
    assert exit_info.value.code == 2
    assert "is not a report written by this command; it is left as it is" in capsys.readouterr().err
    assert mine.read_text() == "my notes"
    other = tmp_path / "elsewhere" / "run.html"
    main(["report", str(run_dir), "--out", str(other)])
    assert other.is_file() and not list(other.parent.glob(".*partial"))


@pytest.mark.parametrize("make, message", [
    (lambda p: p / "missing", "is not a directory"),
    (lambda p: p, "holds no TensorBoard event file"),
])
def test_a_directory_that_is_not_a_run_is_a_usage_error(tmp_path, capsys, make, message):
    with pytest.raises(SystemExit) as exit_info:
        main(["report", str(make(tmp_path))])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("error: report: ") and message in err



def test_report_is_a_command_of_the_cli_with_its_own_help(capsys, monkeypatch):
    monkeypatch.setattr("sys.argv", ["lightning_adv"])
    with pytest.raises(SystemExit) as info:
        main(["report", "--help"])
    assert info.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: python -m lightning_adv report") and "--out OUT" in out
    with pytest.raises(SystemExit) as info:
        main(["--help"])
    assert info.value.code == 0
    words = " ".join(capsys.readouterr().out.split())  # the epilog is wrapped
    assert "report (write one self-contained HTML page of a run directory" in words
