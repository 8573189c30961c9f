# The gateway bench's job, sourced by tests/bench/rblock-gateway (on this
# machine) and tests/bench/vm-rblock-inner (in the VM tier's VM): fio's
# nbd engine at 4 KiB random read, iodepth 1 (p50, p99) and 32 (IOPS), and
# 1 MiB sequential reads and writes at iodepth 8 (MB/s), through each of
# a set of paths in turn, rounds turning the order; then medians and the
# ratios asked for, each with its round-by-round range.
#
# The sourcing script sets `size` (fio's --size) and `secs` (seconds per
# job), and calls gateway_rounds, then gateway_table.

# Every job starts with nothing dirty in the page cache: the write job
# leaves the image dirty, and the kernel's writeback of it 30 s later (a
# gigabyte in a second or two) landed in whichever job ran then.
# (rblock-vs-servers, where it was measured: `measure`.)

# Prints IOPS, p50 and p99 completion latency (µs).
fio_job() { # uri iodepth
  sync
  fio --name=b --ioengine=nbd --uri="$1" --rw=randread --bs=4k --iodepth="$2" \
    --size="$size" --time_based --runtime="$secs" --ramp_time=1 --output-format=json 2>/dev/null |
    python3 -c 'import json, sys
text = sys.stdin.read()
d = json.loads(text[text.index("{"):])["jobs"][0]["read"]
p = d["clat_ns"].get("percentile", {})
print("%.0f %.1f %.1f" % (d["iops"], p.get("50.000000", 0) / 1000, p.get("99.000000", 0) / 1000))'
}

# Prints MB/s of 1 MiB sequential requests, iodepth 8.
fio_bw() { # uri read|write
  sync
  fio --name=b --ioengine=nbd --uri="$1" --rw="$2" --bs=1m --iodepth=8 \
    --size="$size" --time_based --runtime="$secs" --ramp_time=1 --output-format=json 2>/dev/null |
    python3 -c 'import json, sys
text = sys.stdin.read()
d = json.loads(text[text.index("{"):])["jobs"][0][sys.argv[1]]
print("%.0f" % (d["bw_bytes"] / 1e6))' "$2"
}

# Runs ROUNDS rounds of the job through every path (the associative array
# `uri`, path name to NBD URI; the paths in the array `paths`), printing
# each round, and writes every path's values to the file $1 (path, row,
# the values by round). A job that prints nothing fails the bench.
gateway_rounds() { # results-file rounds
  declare -A r
  local round turn s p50 p99 iops rd wr line k
  for round in $(seq "$2"); do
    turn=$(( (round - 1) % ${#paths[@]} ))
    local order=("${paths[@]:turn}" "${paths[@]:0:turn}")
    line="round $round:"
    for s in "${order[@]}"; do
      read -r _ p50 p99 <<<"$(fio_job "${uri[$s]}" 1)"
      read -r iops _ _ <<<"$(fio_job "${uri[$s]}" 32)"
      rd=$(fio_bw "${uri[$s]}" read) wr=$(fio_bw "${uri[$s]}" write)
      if [[ -z $p50 || -z $iops || -z $rd || -z $wr ]]; then
        echo "fio through $s printed nothing" >&2
        return 1
      fi
      r[$s,p50]+=" $p50" r[$s,p99]+=" $p99" r[$s,iops]+=" $iops" r[$s,rd1m]+=" $rd" r[$s,wr1m]+=" $wr"
      line+=" $s $p50/$p99 us $iops IOPS $rd/$wr MB/s;"
    done
    echo "$line"
  done
  echo
  for s in "${paths[@]}"; do
    for k in p50 p99 iops rd1m wr1m; do
      # shellcheck disable=SC2086 # the values are a list of numbers
      printf '%s\t%s\t%s\n' "$s" "$k" "$(echo ${r[$s,$k]})"
    done
  done >"$1"
}

# Prints the medians of every path and the ratios asked for ("a/b ...":
# a's median over b's, with the range of a over b round by round).
gateway_table() { # results-file "paths" "ratios"
  python3 - "$1" "$2" "$3" <<'TABLE'
import statistics, sys
vals = {}
for line in open(sys.argv[1]):
    s, k, v = line.rstrip("\n").split("\t")
    vals[s, k] = [float(x) for x in v.split()]
paths = sys.argv[2].split()
ratios = [tuple(r.split("/")) for r in sys.argv[3].split()]
print("%-6s" % "row" + "".join("%10s" % s for s in paths)
      + "".join("%22s" % ("%s/%s" % r) for r in ratios))
for k in ("p50", "p99", "iops", "rd1m", "wr1m"):
    med = {s: statistics.median(vals[s, k]) for s in paths}
    line = "%-6s" % k + "".join("%10.1f" % med[s] for s in paths)
    for a, b in ratios:
        per = [x / y for x, y in zip(vals[a, k], vals[b, k])]
        line += "%10.2f (%.2f-%.2f)" % (med[a] / med[b], min(per), max(per))
    print(line)
TABLE
}
