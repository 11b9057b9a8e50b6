"""Where a kernel's warps wait, from Nsight Compute's per-instruction samples.

Input: the CSV of `ncu --import R.ncu-rep --page source --csv --print-source sass` (scripts/gpu_profile.sh writes
it gzipped). Prints, per kernel, the share of each stall reason and the hottest SASS lines; with --dump, every
line of one kernel in program order with its samples (to sum a loop's parts by address range).

    python scripts/ncu_hotspots.py out/prefill.sass.csv.gz --top 40
    python scripts/ncu_hotspots.py out/prefill.sass.csv.gz --kernel gdn_chunked_f16 --dump > scan.txt
"""
import argparse
import collections
import csv
import gzip

SAMPLES = "Warp Stall Sampling (All Samples)"


def kernels(path):
    """(kernel name, rows as dicts) per profiled launch, in the file's order."""
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt", newline="") as f:
        rows = list(csv.reader(f))
    i = 0
    while i < len(rows):
        if rows[i] and rows[i][0] == "Kernel Name":
            name, header, i = rows[i][1], rows[i + 1], i + 2
            lines = []
            while i < len(rows) and not (rows[i] and rows[i][0] == "Kernel Name"):
                if len(rows[i]) == len(header):
                    lines.append(dict(zip(header, rows[i])))
                i += 1
            yield name, header, lines
        else:
            i += 1


def number(row, key):
    try:
        return float(row.get(key, "") or 0)
    except ValueError:
        return 0.0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("csv")
    ap.add_argument("--kernel", default="", help="substring of the kernel name")
    ap.add_argument("--top", type=int, default=30)
    ap.add_argument("--dump", action="store_true", help="every SASS line of the first matching kernel")
    args = ap.parse_args()
    seen = set()
    for name, header, lines in kernels(args.csv):
        if name in seen or args.kernel not in name:
            continue
        seen.add(name)
        stalls = [k for k in header if k.startswith("stall_") and "Not Issued" not in k]

        def reasons(row, n=3):
            top = sorted(((number(row, k), k[len("stall_"):]) for k in stalls), reverse=True)[:n]
            return " ".join(f"{k}:{v:.0f}" for v, k in top if v)

        if args.dump:
            for r in lines:
                print(f"{r['Address'][-5:]} {number(r, SAMPLES):6.0f} {number(r, 'Instructions Executed'):9.0f} "
                      f"{r['Source'][:72]:72s} {reasons(r, 2)}")
            return
        total = sum(number(r, SAMPLES) for r in lines) or 1.0
        by_reason = collections.Counter({k: sum(number(r, k) for r in lines) for k in stalls})
        print(f"== {name}: {len(lines)} SASS lines, {total:.0f} samples")
        print("   " + ", ".join(f"{k[len('stall_'):]} {v / total:.1%}" for k, v in by_reason.most_common(10)))
        for r in sorted(lines, key=lambda r: -number(r, SAMPLES))[:args.top]:
            print(f"  {r['Address'][-5:]} {number(r, SAMPLES) / total:6.2%} {r['Source'][:64]:64s} {reasons(r)}")


if __name__ == "__main__":
    main()
