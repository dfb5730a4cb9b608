# Sourced by the comparison scripts: build_pair REV builds revision REV
# and this checkout into $work/ratchet-base and $work/ratchet-this, REV
# from a worktree that cleanup (the EXIT trap set here; a script that sets
# its own calls it last) removes with $work.
cleanup() {
	git -C "$root" worktree remove --force "$work/base" >/dev/null 2>&1 || true
	rm -rf "$work"
}

build_pair() {
	local rev=$1
	root=$(git rev-parse --show-toplevel)
	trap cleanup EXIT
	echo "building $rev and this checkout ($(git -C "$root" rev-parse --short HEAD)$(git -C "$root" diff --quiet || echo ', with changes'))"
	git -C "$root" worktree add --detach "$work/base" "$rev" >/dev/null 2>&1
	(cd "$work/base" && go build -o "$work/ratchet-base" ./cmd/ratchet)
	(cd "$root" && go build -o "$work/ratchet-this" ./cmd/ratchet)
}

# median_of FILE EXPR: the median over FILE's lines of an awk expression.
median_of() {
	awk "{ print $2 }" "$1" | sort -g | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'
}
