"""Per-request figures from callgrind profiles (see instructions-requests.sh).

    callgrind_per_request.py N LABEL=PROFILE ...

Prints, per profile, instructions per request (all, and without memcpy) and allocator calls
per request; with CALLGRIND_DIFF=1, the functions whose own instructions moved most against
the first profile. Expects --compress-strings=no (names written out on every line).
"""
import collections
import os
import re
import sys

ALLOC = "mi_malloc_aligned"


def parse(path):
    own = collections.Counter()
    allocs = 0
    fn = cfn = None
    after_calls = False
    with open(path, errors="replace") as f:
        for line in f:
            if line.startswith("fn="):
                fn, after_calls = re.sub(r"::h[0-9a-f]{16}$", "", line[3:].strip()), False
            elif line.startswith("cfn="):
                cfn = line[4:].strip()
            elif line.startswith("calls="):
                after_calls = True
                if cfn == ALLOC:
                    allocs += int(line[6:].split()[0])
            elif line[:1].isdigit() or line[:1] in "+-*":
                parts = line.split()
                if len(parts) >= 2 and fn is not None:
                    if after_calls:
                        after_calls = False  # the call's inclusive cost, not fn's own
                    else:
                        own[fn] += int(parts[1])
    return own, allocs


def main():
    n = int(sys.argv[1])
    runs = [arg.split("=", 1) for arg in sys.argv[2:]]
    parsed = [(label, *parse(path)) for label, path in runs]
    print("binary\tinstructions_per_request\twithout_memcpy\tallocations_per_request")
    for label, own, allocs in parsed:
        total = sum(own.values())
        memcpy = sum(v for k, v in own.items() if "memcpy" in k or "memmove" in k)
        print(f"{label}\t{total / n:.0f}\t{(total - memcpy) / n:.0f}\t{allocs / n:.1f}")
    if os.environ.get("CALLGRIND_DIFF") and len(parsed) > 1:
        base = parsed[0][1]
        for label, own, _ in parsed[1:]:
            print(f"\nown instructions per request, {parsed[0][0]} -> {label}:")
            keys = sorted(set(base) | set(own), key=lambda k: -abs(own[k] - base[k]))
            for k in keys[:30]:
                print(f"{base[k] / n:9.1f} {own[k] / n:9.1f} {(own[k] - base[k]) / n:+9.1f}  {k[:150]}")


if __name__ == "__main__":
    main()
