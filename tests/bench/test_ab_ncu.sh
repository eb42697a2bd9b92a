#!/bin/bash
# bench/ab_trees.sh's ab_ncu on a made-up Nsight Compute CSV (a fake ncu
# first on PATH prints it): a line per launch with its time in µs, its
# registers and its warp instructions, whatever metrics beside them.
# Usage: test_ab_ncu.sh SOURCE_ROOT
set -eu
root=$1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
row() { # launch metric unit value
	printf '"%s","1","attn","127.0.0.1","void k_attn_packed_tc<4, 128, 1>(const gpu_head *)","1","13","(128, 1, 1)","(322, 8, 1)","0","9.0","Command line profiler metrics","%s","%s","%s"\n' "$@"
}
{
	echo '==PROF== Connected to process 1'
	echo '"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream","Block Size","Grid Size","Device","CC","Section Name","Metric Name","Metric Unit","Metric Value"'
	row 0 gpu__time_duration.sum ns 168768
	row 0 launch__registers_per_thread register/thread 96
	row 0 sm__warps_active.avg.pct_of_peak_sustained_active % 27.3
	row 0 smsp__inst_executed.sum inst 53109014
	row 1 gpu__time_duration.sum ns 1005152
	row 1 launch__registers_per_thread register/thread 128
	row 1 sm__warps_active.avg.pct_of_peak_sustained_active % 22.1
	row 1 smsp__inst_executed.sum inst 757071872
} > "$tmp/page.csv"
cat > "$tmp/ncu" <<EOS
#!/bin/sh
cat "$tmp/page.csv"
EOS
chmod +x "$tmp/ncu"
got=$(cd "$root" && PATH="$tmp:$PATH" bash -c '. bench/ab_trees.sh; ab_ncu "$1" "^k_x$" "" true' _ "$tmp/out.csv")
want=$(printf '  168.8 us  96 regs  53109014 inst\n  1005.2 us  128 regs  757071872 inst')
if [ "$got" != "$want" ]; then
	printf 'ab_ncu printed:\n%s\nwanted:\n%s\n' "$got" "$want" >&2
	exit 1
fi
cmp -s "$tmp/page.csv" "$tmp/out.csv" || { echo "the CSV was not kept" >&2; exit 1; }
echo "ab_ncu: 2 launches parsed"
