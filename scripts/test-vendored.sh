#!/usr/bin/env bash
# Runs the vendored quiche's and tokio-quiche's own unit tests, with rampart's patches applied
# (vendor/patches/*/README.md). They are outside the cargo workspace, so `cargo test
# --workspace` does not reach them; tokio-quiche is tested against the patched quiche beside it
# (its Cargo.toml's [patch]), both against boring 5.4 as in the workspace. They share the
# workspace's target directory, so BoringSSL is not built a second time. That the vendored trees
# are exactly pristine + patches is checked separately, before this, by
# `scripts/vendor-patches.sh check` in `make test`.
set -euo pipefail
cd "$(dirname "$0")/../vendor"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$PWD/../target}"
# The workspace's dev profile keeps line tables only (see ../Cargo.toml); the vendored manifests
# have their own profiles, so say it here too.
export CARGO_PROFILE_DEV_DEBUG="${CARGO_PROFILE_DEV_DEBUG:-line-tables-only}"

# quiche is built as a Rust library only (vendor patch 0052), so its files carry a hash and this
# build (other features and dependency versions) and the workspace's sit side by side.

# Bounded, so a hanging test fails the run instead of eating CI's time.
(cd quiche && timeout 900 cargo test --locked --lib)

# Skipped: these behave the same with the pristine releases (tokio-quiche 0.20.1 against
# quiche 0.30.0, checked 2026-11-22), so they are not rampart's to fix here. The first hangs in
# about half of full runs (it pauses tokio's clock while a client thread handshakes); the other
# five fail, expecting STOP_SENDING to surface through `stream_capacity` where quiche 0.30 does
# not report it.
upstream_failures=(
  quic::router::tests::test_timeout
  http3::driver::tests::server_side_driver::client_sends_body_fin_and_stop_before_first_writable_poll
  http3::driver::tests::server_side_driver::client_sends_stop_sending
  http3::driver::tests::server_side_driver::client_sends_stop_sending_before_first_write
  http3::driver::tests::server_side_driver::stop_sending_before_headers_closes_new_context
  http3::driver::tests::server_side_driver::stop_sending_closes_idle_responses_for_all_request_states
)
skips=()
for t in "${upstream_failures[@]}"; do skips+=(--skip "$t"); done
(cd tokio-quiche && timeout 900 cargo test --locked --lib -- --exact "${skips[@]}")
