//! Per-connection facts recorded during the handshake (for metrics and the access log).

use boring::ssl::{Ssl, SslRef};
use keyengine::SignatureAlgorithm;
use std::sync::OnceLock;

type Index = boring::ex_data::Index<Ssl, SignatureAlgorithm>;

fn index() -> Index {
    static INDEX: OnceLock<Index> = OnceLock::new();
    *INDEX.get_or_init(|| Ssl::new_ex_index().expect("ssl ex_data index"))
}

pub fn set_signature_algorithm(ssl: &mut SslRef, alg: SignatureAlgorithm) {
    ssl.set_ex_data(index(), alg);
}

/// The algorithm the server signed with, or `None` for a resumed handshake.
pub fn signature_algorithm(ssl: &SslRef) -> Option<SignatureAlgorithm> {
    ssl.ex_data(index()).copied()
}
