#!/bin/bash
# On this machine, before bench/attn_ab.sh: for each git revision named
# (a branch, a commit), write the files where it differs from HEAD under
# ab/<name>/ (an overlay of the working tree), so that the GPU machine,
# which gets the working tree but not .git, can build each variant beside
# HEAD in one call.  ab/ is not ignored on purpose (the device tool only
# copies files git does not ignore); delete it after the run.  Only the
# files the revision changed since its merge base with HEAD are taken:
# rebase a branch on HEAD first when HEAD changed the same files.
#
# Usage: bench/attn_ab_prep.sh wip/pdl wip/expand-sel
set -eu
cd "$(dirname "$0")/.."
for rev in "$@"; do
	name=$(echo "$rev" | tr '/' '_')
	rm -rf "ab/$name"
	mkdir -p "ab/$name"
	base=$(git merge-base HEAD "$rev")
	both=$(comm -12 <(git diff --name-only "$base" HEAD | sort) \
			<(git diff --name-only "$base" "$rev" | sort))
	[ -z "$both" ] || echo "warning: HEAD and $rev both changed: $both (rebase $rev)" >&2
	git diff --name-only --diff-filter=AM "$base" "$rev" | while read -r f; do
		mkdir -p "ab/$name/$(dirname "$f")"
		git show "$rev:$f" > "ab/$name/$f"
	done
	gone=$(git diff --name-only --diff-filter=D "$base" "$rev")
	[ -z "$gone" ] || { echo "$rev deletes files ($gone): not supported" >&2; exit 1; }
	echo "ab/$name: $(find "ab/$name" -type f | wc -l) files from $rev"
done
