//! Where a gateway is on this node's link: the interface frames leave by and its MAC address,
//! as a packet socket's destination.

/// Where a gateway is on the link: the interface frames leave by and its MAC address.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Link {
    ifindex: i32,
    mac: [u8; 6],
}

impl Link {
    pub fn new(device: &str, mac: [u8; 6]) -> Option<Link> {
        let name = std::ffi::CString::new(device).ok()?;
        // SAFETY: `name` is a valid NUL-terminated string for the duration of the call.
        let ifindex = unsafe { libc::if_nametoindex(name.as_ptr()) };
        (ifindex != 0).then_some(Link {
            ifindex: ifindex as i32,
            mac,
        })
    }

    pub fn sockaddr(&self) -> libc::sockaddr_ll {
        // SAFETY: sockaddr_ll is plain data; all-zero is a valid value.
        let mut a: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
        a.sll_family = libc::AF_PACKET as u16;
        a.sll_protocol = (libc::ETH_P_IP as u16).to_be();
        a.sll_ifindex = self.ifindex;
        a.sll_halen = 6;
        a.sll_addr[..6].copy_from_slice(&self.mac);
        a
    }
}
