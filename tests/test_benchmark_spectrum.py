"""``benchmarks/spectrum.py`` (imported by path): its resolvent check is the algebra both
routes must satisfy, so the page's error columns can fail."""

from __future__ import annotations

from tests.helpers import load_benchmark


def test_the_resolvent_check_fails_on_wrong_weights_and_the_page_keeps_its_reading(tmp_path):
    bench = load_benchmark("spectrum")
    gram, b = bench.gram_of(256)
    assert gram.shape == (256, 256)
    lam, p = bench.dense_route(gram, b)
    shift = 1e-4 * float(lam.max())
    assert bench.resolvent_error(lam, p, gram, b, shift) < 1e-10
    # weights moved from one eigenvalue to another: the check sees it
    wrong = p.clone()
    wrong[0], wrong[-1] = p[-1], p[0]
    assert bench.resolvent_error(lam, wrong, gram, b, shift) > 1e-6
    record = bench.measure(1100, 1)
    assert record["eigenvalue_difference"] < 1e-12 and record["resolvent_error"] < 1e-8
    page = tmp_path / "page.md"
    page.write_text("old table\n\n## What this run shows\n\nkept reading\n")
    bench.write_markdown([record], page)
    text = page.read_text()
    assert "| 1,100 |" in text and text.endswith("kept reading\n") and "old table" not in text
