//! How a replica names itself where others read it (the `stuck_events` table, the
//! `set-aside` command's answer): its host name — a pod's name under Kubernetes — and its
//! process id.

/// `host:pid`.
pub fn name() -> String {
    format!("{}:{}", host(), std::process::id())
}

/// The other party of a request (the operator): `user@host`.
pub fn operator() -> String {
    let user = std::env::var("USER")
        .or_else(|_| std::env::var("LOGNAME"))
        .unwrap_or_else(|_| "unknown".to_owned());
    format!("{user}@{}", host())
}

fn host() -> String {
    let mut buffer = [0u8; 256];
    // SAFETY: the buffer is writable for its length; gethostname NUL-terminates what fits.
    let ok = unsafe { libc::gethostname(buffer.as_mut_ptr().cast(), buffer.len()) } == 0;
    let end = buffer.iter().position(|&b| b == 0).unwrap_or(buffer.len());
    match std::str::from_utf8(&buffer[..end]) {
        Ok(host) if ok && !host.is_empty() => host.to_owned(),
        _ => "unknown-host".to_owned(),
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_replica_is_named_by_its_host_and_process() {
        let name = super::name();
        let (host, pid) = name.rsplit_once(':').unwrap();
        assert!(!host.is_empty());
        assert_eq!(pid, std::process::id().to_string());
    }
}
