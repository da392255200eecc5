"""``make bench``: every benchmark, each printing ratios against PyTorch measured in the same run."""

from __future__ import annotations

from ci import bench_harness, bench_parity, bench_scaler


def main() -> None:
    bench_scaler.main()
    print()
    bench_harness.main()
    print()
    bench_parity.main()


if __name__ == "__main__":
    main()
