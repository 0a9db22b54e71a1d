# rampart — the two commands: `make run` (build and start the demo) and `make test`.
export PATH := $(HOME)/.cargo/bin:$(PATH)
CARGO ?= cargo

.PHONY: run test deps build lint bench

deps:
	@scripts/install-deps.sh

build: deps
	$(CARGO) build --release -p rampart

## Build and run the demo: self-signed certificates, a demo upstream, the gateway on :8443.
run: build
	./target/release/rampart demo --state-dir state

## Run every test (unit, integration with curl/openssl, CLI).
test: deps
	# vendor/quiche and vendor/tokio-quiche must be their pristine releases + vendor/patches/.
	scripts/vendor-patches.sh check
	$(CARGO) test --workspace
	scripts/test-vendored.sh
	# The fuzz targets (their own workspace, run with cargo-fuzz) still build against ours.
	$(CARGO) check --locked --manifest-path fuzz/Cargo.toml --bins

lint: deps
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --workspace --all-targets -- -D warnings
	# No import cycles between any crate's modules.
	scripts/module-cycles.py crates/*/src

## The foundation benchmark against nginx (see docs/benchmarks.md).
bench:
	WITH_BENCH_TOOLS=1 scripts/install-deps.sh
	scripts/bench-foundation.sh
