"""``benchmarks/feature_passes.py`` (imported by path): its plain forms are the algebra the
operator's passes replace, so the page's agreement column can fail."""

from __future__ import annotations

import torch

from tests.helpers import load_benchmark


def test_the_plain_forms_are_the_dense_algebra_and_the_records_agree(tmp_path):
    bench = load_benchmark("feature_passes")
    op = bench.operator_of(900, 600)
    with torch.no_grad():
        phi = op.feature_map.real_rows(op.data[0][0])
    v = torch.randn(op.width, 4, generator=torch.Generator().manual_seed(0),
                    dtype=torch.float64)
    # S = 0.3 I; sums of 900 terms: relative error far below 1e-12
    expected = phi.T @ (phi @ v) / 0.3
    torch.testing.assert_close(bench.plain_gram(op, v), expected, rtol=1e-12, atol=1e-10)
    dense = phi.T @ phi / 0.3 + torch.eye(op.width, dtype=torch.float64)
    torch.testing.assert_close(bench.plain_dense(op), dense, rtol=1e-12, atol=1e-10)
    records = bench.measure(900, 600, (1, 3), 1, 1e9, True)
    assert [r["what"] for r in records] == ["pass", "pass", "dense"]
    assert all(r["relative_difference"] < 1e-12 and r["seconds"] > 0 for r in records)
    page = tmp_path / "page.md"
    page.write_text("old table\n\n## What this run shows\n\nkept reading\n")
    bench.write_markdown(records, 1e9, page)
    text = page.read_text()
    assert "| dense | 900 | 600 | 600 |" in text and text.endswith("kept reading\n")
    assert "old table" not in text
