#!/usr/bin/env bash
# vendor/quiche and vendor/tokio-quiche are pristine crates.io releases plus rampart's numbered
# patch series in vendor/patches/CRATE/ (PRISTINE names the release, NNNN-*.patch the changes in
# order, README.md indexes them). This script keeps the two in step.
#   scripts/vendor-patches.sh check [CRATE...]   # pristine + series == vendor/CRATE? (default: both)
#   scripts/vendor-patches.sh apply CRATE        # rebuild vendor/CRATE from pristine + series
#   scripts/vendor-patches.sh new CRATE NAME     # vendor/CRATE's edits -> the next NNNN-NAME.patch
# check (run by `make test`) fails naming a patch that does not apply, or listing the files where
# vendor/CRATE differs from pristine + series. To change a vendored crate: edit vendor/CRATE in
# place, then `new` turns the edit into a patch with a header to fill in. apply is for editing a
# patch by hand and for upgrades (set PRISTINE's version, url and sha256 to the new release, apply,
# mend each patch it stops at); it refuses while vendor/CRATE has uncommitted changes unless FORCE=1.
# The .crate files are cached in ${XDG_CACHE_HOME:-$HOME/.cache}/rampart-vendor and checked against
# PRISTINE's sha256 on every use. PRISTINE's `omit PATH` lines (one path a line, a file or a folder,
# relative to the crate root) name what the vendored copy leaves out of the release: each is removed
# from the unpacked release before the first patch, so no patch has to delete it; a PATH the release
# lacks is an error. Patches are applied with `git apply`: exact context, no fuzz, and it handles
# the binary files and symlinks that patch(1) cannot.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD

CRATES=(quiche tokio-quiche)
CACHE="${XDG_CACHE_HOME:-${HOME:-/tmp}/.cache}/rampart-vendor"
# git apply and git diff below work on plain directories, whatever repository this runs in.
unset GIT_DIR GIT_WORK_TREE GIT_INDEX_FILE GIT_OBJECT_DIRECTORY
GIT=(git -c core.quotepath=off -c diff.noprefix=false -c diff.mnemonicPrefix=false
  -c diff.renames=false -c core.autocrlf=false)

usage() { sed -n '2,18p' "$0" >&2; exit 2; }
die() { echo "vendor-patches: $*" >&2; exit 1; }

TMP=$(mktemp -d "${TMPDIR:-/tmp}/rampart-vendor.XXXXXX")
trap 'rm -rf "$TMP"' EXIT

known_crate() {
  local c
  for c in "${CRATES[@]}"; do [ "$c" = "$1" ] && return 0; done
  die "unknown crate '$1' (known: ${CRATES[*]})"
}

# field CRATE KEY: a PRISTINE line's value.
field() {
  local v
  v=$(awk -v k="$2" '$1 == k { print $2 }' "vendor/patches/$1/PRISTINE")
  [ -n "$v" ] || die "vendor/patches/$1/PRISTINE has no '$2' line"
  echo "$v"
}

# omits CRATE: PRISTINE's omit paths, one a line (none is fine).
omits() { sed -n 's/^omit[[:space:]]\{1,\}//p' "vendor/patches/$1/PRISTINE" | sed 's/[[:space:]]*$//'; }

sha256() {
  if command -v sha256sum >/dev/null; then sha256sum "$1" | cut -d' ' -f1
  else shasum -a 256 "$1" | cut -d' ' -f1; fi
}

patches() { find "vendor/patches/$1" -maxdepth 1 -name '[0-9][0-9][0-9][0-9]-*.patch' | sort; }

# crate_file CRATE: the cached .crate, downloaded when missing or not PRISTINE's sha256.
crate_file() {
  local name version url sum file
  name=$(field "$1" name)
  version=$(field "$1" version)
  url=$(field "$1" url)
  sum=$(field "$1" sha256)
  file="$CACHE/$name-$version.crate"
  if [ -f "$file" ] && [ "$(sha256 "$file")" = "$sum" ]; then echo "$file"; return; fi
  mkdir -p "$CACHE"
  echo "vendor-patches: downloading $url" >&2
  if ! curl -fsSL --max-time 60 -o "$file.part" "$url"; then
    rm -f "$file.part"
    die "could not download $url (network unreachable? curl failed); to work offline put the file at $file"
  fi
  local got
  got=$(sha256 "$file.part")
  if [ "$got" != "$sum" ]; then
    rm -f "$file.part"
    die "$url has sha256 $got, vendor/patches/$1/PRISTINE says $sum"
  fi
  mv "$file.part" "$file"
  echo "$file"
}

# build CRATE DIR: pristine release, less PRISTINE's omit paths, + the series, in DIR (created).
build() {
  local crate=$1 dir=$2 file top p
  file=$(crate_file "$crate")
  top="$(field "$crate" name)-$(field "$crate" version)"
  mkdir -p "$dir"
  # -m: extracted files get the current time, so cargo sees every file as changed.
  tar -xzmf "$file" -C "$dir" --strip-components=1 "$top" ||
    die "$file does not unpack as $top/"
  while IFS= read -r p; do
    # Checked here, not in omits, where die would only end the process substitution.
    p=${p%/}
    case "/$p/" in
      // | /[/]* | */./* | */../*)
        die "vendor/patches/$crate/PRISTINE: bad omit path '$p' (relative to the crate root, no . or ..)" ;;
    esac
    [ -e "$dir/$p" ] || [ -L "$dir/$p" ] ||
      die "vendor/patches/$crate/PRISTINE omits '$p', which is not in $top (or a line above omits it already); drop the line"
    rm -rf -- "${dir:?}/$p"
  done < <(omits "$crate")
  while read -r p; do
    [ -n "$p" ] || continue
    # The ceiling keeps git from taking $dir for part of a repository around it.
    if ! (cd "$dir" && GIT_CEILING_DIRECTORIES="$(dirname "$dir")" \
        "${GIT[@]}" apply --whitespace=nowarn "$ROOT/$p"); then
      die "$crate: $(basename "$p") does not apply to pristine $(field "$crate" version) + the patches before it"
    fi
  done < <(patches "$crate")
}

# Executable files and symlinks, which diff -r does not compare by mode.
modes() { (cd "$1" && find . \( -type l -o -type f -perm -u+x \) ! -name .cargo-ok | sort); }

check() {
  local crate failed=0 out modes_diff n
  [ $# -gt 0 ] || set -- "${CRATES[@]}"
  for crate in "$@"; do known_crate "$crate"; done
  for crate in "$@"; do
    build "$crate" "$TMP/$crate"
    n=$(patches "$crate" | wc -l | tr -d ' ')
    out=$(diff -rq --no-dereference -x .cargo_vcs_info.json -x .cargo-ok \
      "$TMP/$crate" "vendor/$crate" 2>&1 | sed "s|$TMP/$crate|(pristine + patches)|g") || true
    modes_diff=$(diff <(modes "$TMP/$crate") <(modes "vendor/$crate") | grep '^[<>]') || true
    if [ -n "$modes_diff" ]; then
      out+="${out:+$'\n'}executable files or symlinks, < pristine + patches, > vendor/$crate:"
      out+=$'\n'"$modes_diff"
    fi
    if [ -n "$out" ]; then
      echo "$out" >&2
      echo "vendor-patches: $crate: vendor/$crate differs from $(field "$crate" version) + $n patches" \
        "(above); make an edit a patch with: scripts/vendor-patches.sh new $crate NAME" >&2
      failed=1
    else
      echo "$crate $(field "$crate" version) + $n patches: OK"
    fi
  done
  return $failed
}

apply() {
  [ $# -eq 1 ] || usage
  local crate=$1
  known_crate "$crate"
  if [ "${FORCE:-0}" != 1 ] && [ -n "$(git status --porcelain -- "vendor/$crate")" ]; then
    git status --short -- "vendor/$crate" >&2
    die "vendor/$crate has uncommitted changes (above); commit them, make them a patch (new), or FORCE=1 to discard them"
  fi
  # Built beside vendor/CRATE, then swapped in, so a failed build leaves it as it was.
  local new="vendor/.$crate.new" old="vendor/.$crate.old"
  rm -rf "$new" "$old"
  build "$crate" "$TMP/$crate"
  mv "$TMP/$crate" "$new"
  mv "vendor/$crate" "$old"
  mv "$new" "vendor/$crate"
  rm -rf "$old"
  echo "vendor/$crate rebuilt: $(field "$crate" version) + $(patches "$crate" | wc -l | tr -d ' ') patches (git status shows what changed)"
}

new() {
  [ $# -eq 2 ] || usage
  local crate=$1 name=$2 last num file diff
  known_crate "$crate"
  [[ $name =~ ^[a-z0-9][a-z0-9.-]*$ ]] || die "NAME is short-kebab-case, e.g. faster-ack-parsing"
  local dir="$TMP/$crate"
  build "$crate" "$dir"
  local g=("${GIT[@]}" -C "$dir" -c user.name=vendor-patches -c user.email=vendor-patches@localhost)
  GIT_CEILING_DIRECTORIES="$TMP" "${g[@]}" init -q
  "${g[@]}" add -A --force
  "${g[@]}" commit -qm base
  find "$dir" -mindepth 1 -maxdepth 1 ! -name .git -exec rm -rf {} +
  cp -a "vendor/$crate/." "$dir/"
  rm -f "$dir/.cargo-ok"
  "${g[@]}" add -A --force
  diff=$("${g[@]}" diff --cached --no-color --no-ext-diff --binary --full-index)
  [ -n "$diff" ] || die "vendor/$crate equals pristine + series: nothing to make a patch of"
  last=$(patches "$crate" | tail -n 1)
  last=$(basename "${last:-0000}")
  num=$(printf '%04d' $((10#${last:0:4} + 1)))
  file="vendor/patches/$crate/$num-$name.patch"
  {
    echo "From 0000000000000000000000000000000000000000 Mon Sep 17 00:00:00 2001"
    echo "From: $(git config user.name || echo TODO) <$(git config user.email || echo TODO)>"
    echo "Date: $(LC_ALL=C date -R)"
    echo "Subject: [PATCH $num] $crate: TODO one line: what the change does"
    echo
    echo "TODO: what the change does and why: the files and functions it touches, what upstream"
    echo "did instead, the measurement or the failing test behind it, the tests that cover it."
    echo
    echo "Upstream: TODO (meant for upstream (general API) | rampart-specific)"
    echo "---"
    "${g[@]}" diff --cached --no-color --stat=72 --summary
    echo
    echo "$diff"
  } >"$file"
  echo "wrote $file: fill in its header and add its line to vendor/patches/$crate/README.md;" \
    "scripts/vendor-patches.sh check $crate should now pass"
}

[ $# -ge 1 ] || usage
cmd=$1
shift
case "$cmd" in
  check) check "$@" ;;
  apply) apply "$@" ;;
  new) new "$@" ;;
  -h | --help | help) usage ;;
  *) usage ;;
esac
