"""``make bench``: every benchmark, each printing ratios against PyTorch measured in the same run."""

from __future__ import annotations

import importlib


def main() -> None:
    for module_name in ("ci.bench_scaler", "ci.bench_harness"):
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            if exc.name != module_name:
                raise
            print(f"({module_name} is not present; skipped)")
            continue
        module.main()
        print()


if __name__ == "__main__":
    main()
