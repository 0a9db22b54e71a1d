//! TLS setup shared by every listener: one builder makes every SSL context (so the QUIC
//! listener can reuse it), certificates are selected by SNI and by the client's signature
//! algorithms, and no private key is ever placed in a context: signatures go through the
//! key engine by [`key_method::EngineKeyMethod`].

pub mod client_hello;
pub mod handshake_info;
mod key_method;
pub mod ocsp;
pub mod tickets;

use crate::config::{CertKeyPair, ListenerConfig, TlsConfig, TlsVersion};
use anyhow::{anyhow, bail, Context as _};
use boring::ssl::{
    select_next_proto, AlpnError, AsyncSelectCertError, BoxSelectCertFinish, ClientHello,
    ExtensionType, NameType, SslAcceptor, SslAcceptorBuilder, SslContext, SslContextBuilder,
    SslMethod, SslVersion,
};
use boring::x509::X509;
use key_method::EngineKeyMethod;
use keyengine::{KeyEngine, KeyId, KeyKind, KeyRegistry, PublicKey};
use std::collections::HashMap;
use std::sync::Arc;
use tickets::TicketKeys;

/// ALPN protocols offered on TCP, in preference order (wire format).
pub const ALPN_TCP: &[u8] = b"\x02h2\x08http/1.1";

/// What a listener needs to accept TLS connections.
pub struct ListenerTls {
    pub acceptor: SslAcceptor,
    pub tickets: Arc<TicketKeys>,
    /// The certificates the acceptor selects from, swapped by a reload.
    pub certs: CertSlot,
}

/// Starts every TLS context of a listener (the front acceptor and each certificate's context)
/// with the same settings: versions, cipher policy, groups, ALPN and the rotating ticket keys.
pub fn context_builder(
    tls: &TlsConfig,
    tickets: &Arc<TicketKeys>,
    alpn: &'static [u8],
) -> anyhow::Result<SslAcceptorBuilder> {
    let mut b = SslAcceptor::mozilla_intermediate_v5(SslMethod::tls())?;
    let min = if tls.versions.contains(&TlsVersion::Tls12) {
        SslVersion::TLS1_2
    } else {
        SslVersion::TLS1_3
    };
    let max = if tls.versions.contains(&TlsVersion::Tls13) {
        SslVersion::TLS1_3
    } else {
        SslVersion::TLS1_2
    };
    b.set_min_proto_version(Some(min))?;
    b.set_max_proto_version(Some(max))?;
    if !tls.tls12_ciphers.is_empty() {
        b.set_strict_cipher_list(&tls.tls12_ciphers.join(":"))
            .context("tls12_ciphers")?;
    }
    configure_common(&mut b, tickets, alpn)?;
    Ok(b)
}

/// Groups, session id context, ALPN and ticket keys: shared by TCP and QUIC contexts.
fn configure_common(
    b: &mut SslContextBuilder,
    tickets: &Arc<TicketKeys>,
    alpn: &'static [u8],
) -> anyhow::Result<()> {
    b.set_curves_list("X25519:P-256:P-384")?;
    b.set_session_id_context(b"rampart")?;
    b.set_alpn_select_callback(move |_ssl, client| {
        select_next_proto(alpn, client).ok_or(AlpnError::NOACK)
    });
    tickets.install(b);
    Ok(())
}

/// The contexts serving one `[[listeners.certificates]]` entry.
#[derive(Clone)]
struct CertEntry {
    rsa: Option<Served>,
    ecdsa: Option<Served>,
    /// Which client-certificate settings the entry's names have (`client_auth`, `client_ca`,
    /// `client_crl`, its own or the listener's): entries with equal ones share the number.
    client_auth_policy: usize,
}

/// One certificate's context and its OCSP response, if it staples one.
#[derive(Clone)]
struct Served {
    ctx: SslContext,
    ocsp: Option<Arc<ocsp::Staple>>,
}

/// Certificates by server name: exact names, then `*.suffix` wildcards, then the default.
pub struct CertStore {
    entries: Vec<CertEntry>,
    exact: HashMap<String, usize>,
    wildcard: HashMap<String, usize>,
    tls13: bool,
}

/// A listener's certificate store, replaced whole when certificates are reloaded: each
/// handshake selects from the store in force when its ClientHello arrives, and keeps the
/// context it selected.
pub type CertSlot = crate::swappable::Swappable<CertStore>;

impl CertStore {
    fn lookup(&self, sni: Option<&str>) -> &CertEntry {
        let idx = sni
            .map(|s| s.trim_end_matches('.').to_ascii_lowercase())
            .and_then(|s| {
                self.exact.get(&s).copied().or_else(|| {
                    s.split_once('.')
                        .and_then(|(_, parent)| self.wildcard.get(parent).copied())
                })
            })
            .unwrap_or(0);
        &self.entries[idx]
    }

    /// The client-certificate settings (a number shared by entries with the same ones) of the
    /// entry that serves `name`: a connection may carry requests for another host only if
    /// its settings are the same (a connection made without a certificate must not reach a
    /// name that requires one).
    pub(crate) fn client_auth_policy(&self, name: Option<&str>) -> usize {
        self.lookup(name).client_auth_policy
    }

    fn select(&self, hello: &ClientHello<'_>) -> Option<Served> {
        let entry = self.lookup(hello.servername(NameType::HOST_NAME));
        let ecdsa_ok = entry.ecdsa.is_some()
            && client_hello::can_use_ecdsa(
                hello.get_extension(ExtensionType::SIGNATURE_ALGORITHMS),
                hello.get_extension(ExtensionType::SUPPORTED_VERSIONS),
                hello.ciphers(),
                self.tls13,
            );
        if ecdsa_ok {
            entry.ecdsa.clone()
        } else {
            entry.rsa.clone().or_else(|| entry.ecdsa.clone())
        }
    }
}

/// The public key of a certificate, for a key engine that signs without the private key.
pub fn certificate_public_key(path: &std::path::Path) -> anyhow::Result<PublicKey> {
    let (leaf, _, _) = load_chain(path)?;
    let pkey = leaf.public_key()?;
    let kind = match pkey.id() {
        boring::pkey::Id::RSA => KeyKind::Rsa,
        boring::pkey::Id::EC => match pkey.ec_key()?.group().curve_name() {
            Some(boring::nid::Nid::X9_62_PRIME256V1) => KeyKind::EcdsaP256,
            Some(boring::nid::Nid::SECP384R1) => KeyKind::EcdsaP384,
            other => bail!("{}: unsupported EC curve {other:?}", path.display()),
        },
        other => bail!("{}: unsupported public key type {other:?}", path.display()),
    };
    PublicKey::from_spki_der(kind, &pkey.public_key_to_der()?)
        .ok_or_else(|| anyhow!("{}: malformed public key in certificate", path.display()))
}

/// Loads a PEM chain and returns (leaf, intermediates, key id of the leaf's public key).
pub fn load_chain(path: &std::path::Path) -> anyhow::Result<(X509, Vec<X509>, KeyId)> {
    let pem = std::fs::read(path).with_context(|| format!("{}: cannot read", path.display()))?;
    let mut chain = X509::stack_from_pem(&pem)
        .map_err(|e| anyhow!("{}: not a PEM certificate chain: {e}", path.display()))?;
    if chain.is_empty() {
        bail!("{}: no certificate found", path.display());
    }
    let leaf = chain.remove(0);
    let spki = leaf.public_key()?.public_key_to_der()?;
    let id = KeyId::from_spki_der(&spki)
        .ok_or_else(|| anyhow!("{}: malformed public key in certificate", path.display()))?;
    Ok((leaf, chain, id))
}

/// The keys a certificate store is checked against (those in force, or those a reload is
/// about to put in force) and the engine its contexts sign with.
struct Signer<'a> {
    keys: &'a KeyRegistry,
    engine: &'a Arc<KeyEngine>,
}

fn cert_context(
    tls: &TlsConfig,
    tickets: &Arc<TicketKeys>,
    alpn: &'static [u8],
    pair: &CertKeyPair,
    expected: KeyKind,
    signer: &Signer<'_>,
    quic: Option<&QuicContextOptions>,
) -> anyhow::Result<Served> {
    let (leaf, intermediates, id) = load_chain(&pair.cert)?;
    let ocsp = match (&pair.ocsp_response, pair.ocsp_fetch) {
        (Some(f), _) => Some(Arc::new(ocsp::Staple::from_file(
            f,
            &pair.cert,
            &leaf,
            intermediates.first(),
        )?)),
        (None, true) => Some(ocsp::Staple::fetching(
            &pair.cert,
            &leaf,
            intermediates.first(),
        )?),
        (None, false) => None,
    };
    let key = signer.keys.get(&id).ok_or_else(|| {
        anyhow!(
            "{}: the key engine holds no key for this certificate (SKI {id}); is {} the matching key?",
            pair.cert.display(),
            pair.key.as_ref().map_or("(none)".into(), |k| k.display().to_string())
        )
    })?;
    let kind = key.public.kind();
    if kind != expected && !(expected == KeyKind::EcdsaP256 && kind == KeyKind::EcdsaP384) {
        bail!(
            "{}: expected a {} certificate, found {}",
            pair.cert.display(),
            expected.as_str(),
            kind.as_str()
        );
    }
    let mut b = context_builder(tls, tickets, alpn)?;
    b.set_certificate(&leaf)?;
    for c in intermediates {
        b.add_extra_chain_cert(c)?;
    }
    let sigalgs = match kind {
        KeyKind::Rsa => "rsa_pss_rsae_sha256:rsa_pss_rsae_sha384:rsa_pss_rsae_sha512:rsa_pkcs1_sha256:rsa_pkcs1_sha384:rsa_pkcs1_sha512",
        // In TLS 1.2 a P-256 key also signs with SHA-384 and SHA-512 (BoringSSL offers those
        // only there: TLS 1.3 binds each hash to its curve).
        KeyKind::EcdsaP256 => "ecdsa_secp256r1_sha256:ecdsa_secp384r1_sha384:ecdsa_secp521r1_sha512",
        KeyKind::EcdsaP384 => "ecdsa_secp384r1_sha384",
    };
    b.set_sigalgs_list(sigalgs).context("signing algorithms")?;
    match quic {
        Some(q) => q.apply(&mut b),
        None => {
            if tls.early_data {
                enable_early_data(&mut b);
            }
        }
    }
    require_client_certs(&mut b, tls)?;
    // No set_private_key(): the key stays in the engine.
    b.set_async_private_key_method(EngineKeyMethod {
        engine: signer.engine.clone(),
        key: id,
        kind,
    });
    Ok(Served {
        ctx: b.build().into_context(),
        ocsp,
    })
}

/// Builds the certificate store of one listener for one ALPN set (TCP or QUIC).
fn build_store(
    listener: &ListenerConfig,
    signer: &Signer<'_>,
    tickets: &Arc<TicketKeys>,
    alpn: &'static [u8],
    tls13: bool,
    quic: Option<&QuicContextOptions>,
) -> anyhow::Result<CertStore> {
    let tls = &listener.tls;
    let mut store = CertStore {
        entries: vec![],
        exact: HashMap::new(),
        wildcard: HashMap::new(),
        tls13,
    };
    let policies = listener.client_auth_policies();
    for (i, c) in listener.certificates.iter().enumerate() {
        let field = |k: &str| format!("listeners[{}].certificates[{i}].{k}", listener.name);
        // The entry's own client-certificate settings, if any, over the listener's.
        let tls = &c.effective_tls(tls);
        let rsa = c
            .rsa
            .as_ref()
            .map(|p| cert_context(tls, tickets, alpn, p, KeyKind::Rsa, signer, quic))
            .transpose()
            .with_context(|| field("rsa"))?;
        let ecdsa = c
            .ecdsa
            .as_ref()
            .map(|p| cert_context(tls, tickets, alpn, p, KeyKind::EcdsaP256, signer, quic))
            .transpose()
            .with_context(|| field("ecdsa"))?;
        store.entries.push(CertEntry {
            rsa,
            ecdsa,
            client_auth_policy: policies[i],
        });
        for n in &c.server_names {
            let n = n.to_ascii_lowercase();
            match n.strip_prefix("*.") {
                Some(suffix) => store.wildcard.entry(suffix.to_string()).or_insert(i),
                None => store.exact.entry(n).or_insert(i),
            };
        }
    }
    Ok(store)
}

/// Installs SNI + signature-algorithm certificate selection on a front context. With
/// `anti_replay`, a ClientHello that offers early data is first checked against the fleet's
/// records, and a replayed one (or one Redis gave no answer for) has its early data turned
/// off before the handshake goes on ([`crate::fleet::anti_replay`]).
fn install_selection(
    b: &mut SslContextBuilder,
    certs: CertSlot,
    anti_replay: Option<Arc<crate::fleet::anti_replay::AntiReplay>>,
) {
    use crate::fleet::anti_replay::AntiReplay;
    use boring::ssl::ExtensionType;
    b.set_async_select_certificate_callback(move |hello| {
        let Served { ctx, ocsp } = certs.current().select(hello).ok_or(AsyncSelectCertError)?;
        // The certificate's OCSP response while it is fresh (BoringSSL sends it only to
        // clients that asked, in status_request).
        let staple = ocsp.and_then(|o| o.fresh(std::time::SystemTime::now()));
        let check = anti_replay.clone().and_then(|a| {
            hello.get_extension(ExtensionType::EARLY_DATA)?;
            let psk = hello.get_extension(ExtensionType::PRE_SHARED_KEY)?;
            Some((a, AntiReplay::record_of(psk)))
        });
        Ok(Box::pin(async move {
            let early_data_ok = match &check {
                Some((a, record)) => a.first_use(record).await,
                None => true,
            };
            Ok(Box::new(move |mut hello: ClientHello<'_>| {
                hello
                    .ssl_mut()
                    .set_ssl_context(&ctx)
                    .map_err(|_| AsyncSelectCertError)?;
                // The name's client-certificate mode: switching contexts brings its verify
                // store, CA list and session context, but the mode stays the listener's.
                hello.ssl_mut().set_verify(ctx.verify_mode());
                if let Some(der) = &staple {
                    hello
                        .ssl_mut()
                        .set_ocsp_status(der)
                        .map_err(|_| AsyncSelectCertError)?;
                }
                if !early_data_ok {
                    // SAFETY: the SSL is live for the callback; SSL_set_early_data_enabled
                    // only clears a flag on it, read when the server decides on early data
                    // (after this callback), so the handshake goes on as 1-RTT.
                    unsafe {
                        boring_sys::SSL_set_early_data_enabled(
                            foreign_types::ForeignTypeRef::as_ptr(hello.ssl_mut()),
                            0,
                        )
                    };
                }
                Ok(())
            }) as BoxSelectCertFinish)
        }))
    });
}

/// With `tls.client_auth`, asks clients (TCP and QUIC) for a certificate (and with `required`, refuses
/// those without one) that must chain to `tls.client_ca` and, with `tls.client_crl`, not be
/// revoked; a presented certificate that fails is a failed handshake. Errors name the field.
fn require_client_certs(b: &mut SslContextBuilder, tls: &TlsConfig) -> anyhow::Result<()> {
    use crate::config::ClientAuth;
    use boring::ssl::SslVerifyMode;
    let mode = match tls.client_auth {
        ClientAuth::None => return Ok(()),
        ClientAuth::Optional => SslVerifyMode::PEER,
        ClientAuth::Required => SslVerifyMode::PEER | SslVerifyMode::FAIL_IF_NO_PEER_CERT,
    };
    let ca_path = tls.client_ca.as_ref().expect("validated");
    let material = client_auth_material(ca_path, tls.client_crl.as_deref())?;
    let mut names = boring::stack::Stack::new()?;
    for name in &material.names {
        names.push(dup_name(name)?)?;
    }
    b.set_verify(mode);
    b.set_verify_cert_store(material.store.clone())?;
    b.set_client_ca_list(names);
    // The context keeps the material alive, so that contexts made from the same files (other
    // names, the QUIC listener, the next reload) share it, and the cache forgets it after them.
    static HOLDS: std::sync::OnceLock<boring::ex_data::Index<SslContext, Arc<ClientAuthMaterial>>> =
        std::sync::OnceLock::new();
    let index = match HOLDS.get() {
        Some(i) => *i,
        None => *HOLDS.get_or_init(|| SslContext::new_ex_index().expect("an ex_data index")),
    };
    b.set_ex_data(index, material);
    // Sessions resume only under the same client-certificate settings: a session made where
    // none was asked for must not resume for a name that requires one.
    let mut sid = boring::sha::Sha256::new();
    sid.update(format!("{:?}", tls.client_auth).as_bytes());
    sid.update(ca_path.as_os_str().as_encoded_bytes());
    if let Some(crl) = &tls.client_crl {
        sid.update(crl.as_os_str().as_encoded_bytes());
    }
    b.set_session_id_context(&sid.finish())?;
    Ok(())
}

/// What a client-certificate check is made of: the verify store of the CAs (with the CRL,
/// checked) and the CAs' names (sent to clients as the acceptable ones).
pub(crate) struct ClientAuthMaterial {
    store: boring::x509::store::X509Store,
    names: Vec<boring::x509::X509Name>,
}

/// The client-certificate material of the CAs in `ca_path` (and the CRL in `crl_path`). Parsed
/// once per contents: every TLS context of every listener and name that uses the same files
/// shares it while any of them lives (each holds the `Arc` in its ex_data), files whose
/// contents changed are parsed again (a reload), and material no context holds any more is
/// forgotten. Errors name the field and the file.
fn client_auth_material(
    ca_path: &std::path::Path,
    crl_path: Option<&std::path::Path>,
) -> anyhow::Result<Arc<ClientAuthMaterial>> {
    use boring::x509::store::X509Store;
    use std::sync::Weak;
    static PARSED: std::sync::Mutex<Option<HashMap<Vec<u8>, Weak<ClientAuthMaterial>>>> =
        std::sync::Mutex::new(None);
    let pem = std::fs::read(ca_path)
        .map_err(|e| anyhow!("tls.client_ca: {}: cannot read: {e}", ca_path.display()))?;
    let crl = crl_path
        .map(|p| {
            std::fs::read(p)
                .map_err(|e| anyhow!("tls.client_crl: {}: cannot read: {e}", p.display()))
        })
        .transpose()?;
    let mut key = boring::sha::sha256(&pem).to_vec();
    if let Some(crl) = &crl {
        key.extend_from_slice(&boring::sha::sha256(crl));
    }
    let mut parsed = PARSED.lock().unwrap_or_else(|e| e.into_inner());
    let parsed = parsed.get_or_insert_with(HashMap::new);
    parsed.retain(|_, m| m.strong_count() > 0);
    if let Some(m) = parsed.get(&key).and_then(Weak::upgrade) {
        return Ok(m);
    }
    let cas = X509::stack_from_pem(&pem)
        .ok()
        .filter(|c| !c.is_empty())
        .ok_or_else(|| {
            anyhow!(
                "tls.client_ca: {}: expected PEM certificates (-----BEGIN CERTIFICATE-----)",
                ca_path.display()
            )
        })?;
    let mut store = boring::x509::store::X509StoreBuilder::new()?;
    let mut names = Vec::with_capacity(cas.len());
    for ca in cas {
        names.push(dup_name(ca.subject_name())?);
        store.add_cert(ca)?;
    }
    if let (Some(crl), Some(crl_path)) = (&crl, crl_path) {
        add_crl(&mut store, crl).map_err(|()| {
            anyhow!(
                "tls.client_crl: {}: expected a PEM CRL (-----BEGIN X509 CRL-----)",
                crl_path.display()
            )
        })?;
        store.set_flags(boring::x509::verify::X509VerifyFlags::CRL_CHECK);
    }
    let store: X509Store = store.build();
    let material = Arc::new(ClientAuthMaterial { store, names });
    parsed.insert(key, Arc::downgrade(&material));
    Ok(material)
}

/// A copy of `name` (boring 5.4 has no safe one).
fn dup_name(name: &boring::x509::X509NameRef) -> anyhow::Result<boring::x509::X509Name> {
    use foreign_types::{ForeignType, ForeignTypeRef};
    // SAFETY: X509_NAME_dup reads the live name behind the reference and returns a new one
    // owned by the caller (or null, checked), which X509Name takes over and frees.
    unsafe {
        let copy = boring_sys::X509_NAME_dup(name.as_ptr());
        if copy.is_null() {
            bail!("copying a client CA's name");
        }
        Ok(boring::x509::X509Name::from_ptr(copy))
    }
}

/// Adds the CRL in `pem` to `store`.
fn add_crl(store: &mut boring::x509::store::X509StoreBuilder, pem: &[u8]) -> Result<(), ()> {
    use foreign_types::ForeignTypeRef;
    let len = std::os::raw::c_int::try_from(pem.len()).map_err(|_| ())?;
    // SAFETY: the BIO reads `pem` (alive for the call) and is freed here; the CRL it yields is
    // owned here and freed after X509_STORE_add_crl, which takes its own reference.
    unsafe {
        let bio = boring_sys::BIO_new_mem_buf(pem.as_ptr().cast(), len as _);
        if bio.is_null() {
            return Err(());
        }
        let crl = boring_sys::PEM_read_bio_X509_CRL(
            bio,
            std::ptr::null_mut(),
            None,
            std::ptr::null_mut(),
        );
        boring_sys::BIO_free(bio);
        if crl.is_null() {
            return Err(());
        }
        let added = boring_sys::X509_STORE_add_crl(store.as_ptr(), crl);
        boring_sys::X509_CRL_free(crl);
        if added == 1 {
            Ok(())
        } else {
            Err(())
        }
    }
}

/// Builds the acceptor of one listener; `anti_replay` (given with `tls.early_data` and a
/// fleet) checks each early-data attempt against the fleet's records.
pub fn listener_tls(
    listener: &ListenerConfig,
    engine: &Arc<KeyEngine>,
    alpn: &'static [u8],
    anti_replay: Option<Arc<crate::fleet::anti_replay::AntiReplay>>,
) -> anyhow::Result<ListenerTls> {
    let tls = &listener.tls;
    let tickets = match &tls.ticket_key_file {
        Some(path) => {
            TicketKeys::from_file(path).map_err(|e| anyhow!("tls.ticket_key_file: {e}"))?
        }
        None => TicketKeys::new(),
    };
    let keys = engine.registry();
    let signer = Signer {
        keys: &keys,
        engine,
    };
    let store = build_store(
        listener,
        &signer,
        &tickets,
        alpn,
        tls.versions.contains(&TlsVersion::Tls13),
        None,
    )?;
    let certs = CertSlot::new(store);
    let mut front = context_builder(tls, &tickets, alpn)?;
    if tls.early_data {
        enable_early_data(&mut front);
    }
    require_client_certs(&mut front, tls)?;
    install_selection(&mut front, certs.clone(), anti_replay);
    Ok(ListenerTls {
        acceptor: front.build(),
        tickets,
        certs,
    })
}

/// Lets resumed clients send 0-RTT early data. BoringSSL copies this setting from a context
/// when `set_ssl_context` switches to it, so every per-name context of a listener that accepts
/// early data needs it too (boring 5.4 has no safe wrapper).
fn enable_early_data(b: &mut SslContextBuilder) {
    // SAFETY: `b.as_ptr()` is a valid, exclusively borrowed SSL_CTX for this call;
    // SSL_CTX_set_early_data_enabled only stores a flag on it.
    unsafe { boring_sys::SSL_CTX_set_early_data_enabled(b.as_ptr(), 1) };
}

/// ALPN for HTTP/3.
pub const ALPN_H3: &[u8] = b"\x02h3";

/// What a QUIC listener needs to make its SSL context: the same certificates, key engine
/// and ticket keys as the TCP listener beside it, TLS 1.3 only, ALPN h3.
#[derive(Clone)]
pub struct QuicTls {
    store: CertSlot,
    tickets: Arc<TicketKeys>,
    options: QuicContextOptions,
    /// The listener's TLS section: its client-certificate settings apply to QUIC too.
    tls: TlsConfig,
}

/// Called with a connection's SSL when its handshake completes (QUIC metrics).
pub type HandshakeObserver = Arc<dyn Fn(&boring::ssl::SslRef) + Send + Sync>;

/// What QUIC contexts add to the common setup.
#[derive(Clone)]
pub struct QuicContextOptions {
    pub early_data: bool,
    pub observer: Option<HandshakeObserver>,
    /// With early data and `[fleet] redis`: the fleet's replay records (given only then).
    pub anti_replay: Option<Arc<crate::fleet::anti_replay::AntiReplay>>,
}

impl QuicContextOptions {
    fn apply(&self, b: &mut SslContextBuilder) {
        if self.early_data {
            enable_early_data(b);
        }
        if let Some(obs) = &self.observer {
            let obs = obs.clone();
            // The callback of the context the SSL uses when the handshake ends runs (the
            // per-name one after certificate selection), so every QUIC context gets it.
            b.set_info_callback(move |ssl, mode, _| {
                if mode == boring::ssl::SslInfoCallbackMode::HANDSHAKE_DONE {
                    obs(ssl);
                }
            });
        }
    }
}

impl QuicTls {
    pub fn new(
        listener: &ListenerConfig,
        engine: &Arc<KeyEngine>,
        tickets: &Arc<TicketKeys>,
        observer: Option<HandshakeObserver>,
        anti_replay: Option<Arc<crate::fleet::anti_replay::AntiReplay>>,
    ) -> anyhow::Result<Self> {
        let options = QuicContextOptions {
            early_data: listener.quic.early_data,
            observer,
            anti_replay,
        };
        let keys = engine.registry();
        let signer = Signer {
            keys: &keys,
            engine,
        };
        let store = build_store(listener, &signer, tickets, ALPN_H3, true, Some(&options))?;
        Ok(QuicTls {
            store: CertSlot::new(store),
            tickets: tickets.clone(),
            options,
            tls: listener.tls.clone(),
        })
    }

    /// A fresh front context builder (tokio-quiche asks once per socket).
    pub fn front_builder(&self) -> anyhow::Result<SslContextBuilder> {
        let mut b = SslContextBuilder::new(SslMethod::tls())?;
        b.set_min_proto_version(Some(SslVersion::TLS1_3))?;
        b.set_max_proto_version(Some(SslVersion::TLS1_3))?;
        configure_common(&mut b, &self.tickets, ALPN_H3)?;
        self.options.apply(&mut b);
        require_client_certs(&mut b, &self.tls)?;
        install_selection(&mut b, self.store.clone(), self.options.anti_replay.clone());
        Ok(b)
    }
}

/// What reloading one listener's certificates replaces: the store its TCP acceptor selects
/// from and, with HTTP/3, the QUIC one. Ticket keys and every other setting stay.
pub struct ListenerCerts {
    tickets: Arc<TicketKeys>,
    tcp: CertSlot,
    quic: Option<QuicTls>,
}

/// A listener's stores built afresh, not yet in force.
pub struct PreparedCerts {
    tcp: CertStore,
    quic: Option<CertStore>,
}

impl ListenerCerts {
    /// `tickets` and `tcp` are the listener's [`ListenerTls`] parts.
    pub fn new(tickets: &Arc<TicketKeys>, tcp: &CertSlot, quic: Option<&QuicTls>) -> Self {
        ListenerCerts {
            tickets: tickets.clone(),
            tcp: tcp.clone(),
            quic: quic.cloned(),
        }
    }

    /// Reads the certificate files of `listener` (this listener's settings, its certificates
    /// perhaps new) and builds its stores, checked against `keys` (the keys about to be put
    /// in force) and signing through `engine`. Swaps nothing, so an error leaves the listener
    /// as it was.
    pub fn prepare(
        &self,
        listener: &ListenerConfig,
        keys: &KeyRegistry,
        engine: &Arc<KeyEngine>,
    ) -> anyhow::Result<PreparedCerts> {
        let signer = Signer { keys, engine };
        let l = listener;
        let tcp = build_store(
            l,
            &signer,
            &self.tickets,
            ALPN_TCP,
            l.tls.versions.contains(&TlsVersion::Tls13),
            None,
        )?;
        let quic = self
            .quic
            .as_ref()
            .map(|q| build_store(l, &signer, &self.tickets, ALPN_H3, true, Some(&q.options)))
            .transpose()?;
        Ok(PreparedCerts { tcp, quic })
    }

    /// Puts prepared stores in force: handshakes from now on select from them.
    pub fn install(&self, prepared: PreparedCerts) {
        self.tcp.replace(prepared.tcp);
        if let (Some(q), Some(store)) = (&self.quic, prepared.quic) {
            q.store.replace(store);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ca_pem(cn: &str) -> Vec<u8> {
        let key = boring::pkey::PKey::from_ec_key(
            boring::ec::EcKey::generate(
                &boring::ec::EcGroup::from_curve_name(boring::nid::Nid::X9_62_PRIME256V1).unwrap(),
            )
            .unwrap(),
        )
        .unwrap();
        let mut name = boring::x509::X509NameBuilder::new().unwrap();
        name.append_entry_by_text("CN", cn).unwrap();
        let name = name.build();
        let mut b = boring::x509::X509Builder::new().unwrap();
        b.set_subject_name(&name).unwrap();
        b.set_issuer_name(&name).unwrap();
        b.set_pubkey(&key).unwrap();
        b.set_not_before(&boring::asn1::Asn1Time::days_from_now(0).unwrap())
            .unwrap();
        b.set_not_after(&boring::asn1::Asn1Time::days_from_now(1).unwrap())
            .unwrap();
        b.sign(&key, boring::hash::MessageDigest::sha256()).unwrap();
        b.build().to_pem().unwrap()
    }

    fn cn(name: &boring::x509::X509NameRef) -> String {
        let entry = name
            .entries_by_nid(boring::nid::Nid::COMMONNAME)
            .next()
            .unwrap();
        entry.data().as_utf8().unwrap().to_string()
    }

    #[test]
    fn client_ca_files_are_parsed_once_per_contents() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ca.pem");
        std::fs::write(&path, ca_pem("first")).unwrap();
        let a = client_auth_material(&path, None).unwrap();
        let b = client_auth_material(&path, None).unwrap();
        assert!(Arc::ptr_eq(&a, &b), "the same contents share one store");
        assert_eq!(cn(&a.names[0]), "first");
        // The cache holds no strong reference: once the contexts drop it, it is freed.
        let weak = Arc::downgrade(&a);
        drop((a, b));
        assert!(weak.upgrade().is_none(), "the cache keeps nothing alive");
        let again = client_auth_material(&path, None).unwrap();
        assert_eq!(cn(&again.names[0]), "first");
        // Changed contents (a reload): parsed again, the new CA's name.
        std::fs::write(&path, ca_pem("second")).unwrap();
        let c = client_auth_material(&path, None).unwrap();
        assert!(!Arc::ptr_eq(&again, &c));
        assert_eq!(cn(&c.names[0]), "second");
        std::fs::write(&path, "not pem").unwrap();
        let e = client_auth_material(&path, None)
            .err()
            .expect("refused")
            .to_string();
        assert!(e.contains("tls.client_ca") && e.contains("ca.pem"), "{e}");
    }
}
