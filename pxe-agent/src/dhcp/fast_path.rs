//! What the XDP program may answer: [`fast_path`], the projection of the
//! policy (`decide`) onto the requests whose answer the kernel can give
//! exactly, from a template, and why it passes or drops the rest
//! ([`Decision`]). It is not a second policy: every reply it lets the
//! kernel give is `decide`'s. The templates are compiled in `template`;
//! what only the frame shows is the XDP program's own business.

use std::borrow::Cow;

use dhcproto::v4::MessageType;
use pxe_ebpf_common::{
    BootClass, Counter, boot_class,
    bootp::{HTTP_CLIENT, PXE_CLIENT},
};

use super::{
    Request,
    decide::{Answer, boot_answer, decide, on_segment},
    reply::{Reply, ReplyKind, Server},
};
use crate::inventory::{Host, Inventory, Profile, Rule, Subnet};

/// The fast path's verdict on a request.
#[derive(Clone, Debug, PartialEq)]
pub enum Decision {
    Reply(Reply),
    /// Not answered here; the counter says why.
    Pass(Counter),
    /// Ignored on purpose (RFC 2131: the client chose another server).
    Drop(Counter),
}

/// What the XDP program does with `req`: a projection of [`decide`], not a
/// second policy. The kernel answers exactly when `decide` answers with an
/// OFFER or ACK whose bytes depend on nothing the kernel cannot see: the
/// request is a DISCOVER or REQUEST without iPXE or relay-agent options,
/// from firmware of a boot class, for a host whose profile answers every
/// request of that class alike (so one template per host and class holds
/// the reply). Everything else is passed up, with the reason the kernel
/// counts it under; a REQUEST that selects another server is dropped, as
/// the slow path ignores it. What only the frame shows is the kernel's own
/// business and not judged here: malformed or VLAN-tagged frames, IP
/// options, too many options, no room to grow, and frames not addressed to
/// this server (`pass_not_for_us`).
pub fn fast_path(req: &Request, inv: &Inventory, server: &Server) -> Decision {
    // In the kernel's order, so that both name the same reason.
    let Some(msg_type) = req.msg_type else {
        return Decision::Pass(Counter::PassMessageType);
    };
    if req.ipxe {
        return Decision::Pass(Counter::PassIpxe);
    }
    if !matches!(msg_type, MessageType::Discover | MessageType::Request) {
        return Decision::Pass(Counter::PassMessageType);
    }
    // Option 82 must be echoed (RFC 3046 2.2), from a relay agent or from a
    // snooping switch that left giaddr 0 alike.
    if req.relay_info {
        return Decision::Pass(Counter::PassRelay);
    }
    let Some(class) = boot_class(req.arch, req.vendor) else {
        return Decision::Pass(Counter::PassUnsupportedClient);
    };
    let Some(host) = inv.host_by_mac(req.chaddr) else {
        return Decision::Pass(Counter::PassUnknownHost);
    };
    // An interface's map holds the hosts of its own segment only (the
    // templates are compiled from broadcast requests): another segment's
    // host, relayed or renewing, is the slow path's.
    if !kernel_answers(inv.profile_of(host), host, class, server) || !on_segment(inv, host, server)
    {
        return Decision::Pass(Counter::PassUnknownHost);
    }
    if let Some(reason) = proxy_kernel_passes(req, inv, host, class, server) {
        return Decision::Pass(reason);
    }
    match decide(req, inv, server) {
        Answer::Reply(reply) if reply.kind != ReplyKind::Nak => Decision::Reply(reply),
        // The kernel sends no NAKs: the slow path does.
        Answer::Reply(_) => Decision::Pass(Counter::PassRequestMismatch),
        Answer::Ignore(Counter::DropOtherServer) => Decision::Drop(Counter::DropOtherServer),
        Answer::Ignore(reason) => Decision::Pass(reason),
        Answer::Pool(_) | Answer::Release { .. } | Answer::Decline { .. } | Answer::NotOurs => {
            Decision::Pass(Counter::PassUnknownHost)
        }
        // Not reached: only DISCOVERs and REQUESTs get this far.
        Answer::ReservationDeclined { .. } => Decision::Pass(Counter::PassMessageType),
    }
}

/// Whether the kernel holds a template for `host` in `class`, which is
/// where the projection narrows `decide`:
/// - every request of the class that reaches the kernel must get the same
///   reply: no rule that can apply there reads more of the request than its
///   class. Rules on the user class or option 82 never apply there (such
///   requests are passed up first), nor do vendor-class prefixes that
///   cannot start the class's option 60;
/// - the class is one the profile boots, or the profile boots nothing: the
///   map holds what the fleet boots, and the odd firmware of a class the
///   profile names no file for gets its address-only answer from the slow
///   path.
fn kernel_answers(profile: &Profile, host: &Host, class: BootClass, server: &Server) -> bool {
    let rules = fast_path_rules(profile, class);
    let Some((boot, _)) = rules.boot_for_arches(&host.labels, class.arches()) else {
        return false;
    };
    boot_answer(
        profile,
        boot.as_ref(),
        class,
        None,
        host.mac,
        &server.ip.to_string(),
    )
    .is_some()
}

/// Where the kernel's part of proxyDHCP ends, for a host of a subnet in
/// mode proxy: it holds a host's proxy OFFER for a class (`decide`'s answer
/// to the class's DISCOVER) when there is one, and gives it only to
/// requests without option 97, which the answer echoes. REQUESTs on port
/// 67 it drops or passes as `decide` ignores them.
fn proxy_kernel_passes(
    req: &Request,
    inv: &Inventory,
    host: &Host,
    class: BootClass,
    server: &Server,
) -> Option<Counter> {
    if !inv.subnet_of(host).is_some_and(Subnet::is_proxy) {
        return None;
    }
    let template = Request::of_class(host.mac, class, None);
    if !matches!(decide(&template, inv, server), Answer::Reply(_)) {
        return Some(Counter::PassUnknownHost);
    }
    // In the kernel's order: a foreign relay before option 97.
    if !req.giaddr.is_unspecified() && !inv.subnet_of(host).is_some_and(|s| s.contains(req.giaddr))
    {
        return Some(Counter::PassRelay);
    }
    req.more
        .client_uuid
        .is_some()
        .then_some(Counter::PassClientUuid)
}

/// The profile with only the rules that can apply to a request the fast
/// path sees in `class`: requests with a user class (77) or relay
/// information (82) never reach it, and a vendor-class prefix that cannot
/// start the class's option 60 never matches there. What is left and still
/// reads the request makes `boot_for_arches` decline the class.
fn fast_path_rules(profile: &Profile, class: BootClass) -> Cow<'_, Profile> {
    let possible = |rule: &Rule| {
        rule.when.user_class.is_none()
            && rule.when.circuit_id.is_none()
            && rule
                .when
                .vendor_class
                .as_deref()
                .is_none_or(|p| vendor_prefix_fits(p.as_bytes(), class))
    };
    if profile.rules.iter().all(possible) {
        return Cow::Borrowed(profile);
    }
    let mut only = profile.clone();
    only.rules.retain(possible);
    Cow::Owned(only)
}

/// Whether an option 60 value starting with `prefix` can belong to `class`.
fn vendor_prefix_fits(prefix: &[u8], class: BootClass) -> bool {
    let compatible = |required: &[u8]| prefix.starts_with(required) || required.starts_with(prefix);
    match class {
        BootClass::Http | BootClass::HttpArm64 | BootClass::HttpIa32 => compatible(HTTP_CLIENT),
        BootClass::Bios | BootClass::UefiX64 | BootClass::UefiArm64 => compatible(PXE_CLIENT),
        BootClass::Plain => !prefix.starts_with(PXE_CLIENT) && !prefix.starts_with(HTTP_CLIENT),
    }
}

#[cfg(test)]
mod tests;
