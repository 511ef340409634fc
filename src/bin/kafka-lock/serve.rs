//! `--metrics-listen ADDR`: the library's metrics (`kafka_lock::metrics`) in Prometheus text
//! format at `http://ADDR/metrics`, answered by a small HTTP/1.1 responder on the lock's own
//! runtime. The exporter crate's own listener would bring hyper; a scrape needs one GET.
//!
//! Nothing here can hold up the lock session: every connection is a task with a deadline, reads
//! are bounded, and beyond a few concurrent connections new ones are closed at once.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use kafka_lock::metrics::{ACQUIRE_SECONDS, HOLD_SECONDS};
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;

use crate::exit::{self, Failure};

/// Acquisitions range from milliseconds (a free lock) to hours (a queue behind long jobs).
const ACQUIRE_BUCKETS: &[f64] = &[
    0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 3600.0,
];
/// Holds of coarse locks: seconds to a day.
const HOLD_BUCKETS: &[f64] = &[
    1.0, 10.0, 60.0, 300.0, 900.0, 1800.0, 3600.0, 7200.0, 14400.0, 43200.0, 86400.0,
];
/// A scrape is one small request; anything slower or larger is not a scraper.
const CONNECTION_DEADLINE: Duration = Duration::from_secs(10);
const MAX_REQUEST_HEAD: usize = 8 * 1024;
const MAX_CONNECTIONS: usize = 8;
/// How often histograms' recent samples are folded in between scrapes.
const UPKEEP: Duration = Duration::from_secs(5);

/// Binds `addr`, installs the Prometheus recorder and serves it for as long as the runtime runs.
/// Returns the bound address (port 0 picks one).
pub async fn start(addr: SocketAddr) -> Result<SocketAddr, Failure> {
    let listener = TcpListener::bind(addr).await.map_err(|e| {
        Failure::new(
            exit::CONFIG,
            format!("cannot listen on --metrics-listen {addr}: {e}; choose a free port on an address of this host"),
        )
    })?;
    let local = listener.local_addr().map_err(|e| {
        Failure::new(
            exit::OSERR,
            format!("cannot read the metrics listener's address: {e}"),
        )
    })?;
    let handle = PrometheusBuilder::new()
        .set_buckets_for_metric(Matcher::Full(ACQUIRE_SECONDS.to_owned()), ACQUIRE_BUCKETS)
        .and_then(|b| {
            b.set_buckets_for_metric(Matcher::Full(HOLD_SECONDS.to_owned()), HOLD_BUCKETS)
        })
        .and_then(|b| b.install_recorder())
        .map_err(|e| {
            Failure::new(
                exit::OSERR,
                format!("cannot set up the metrics recorder: {e}"),
            )
        })?;
    let upkeep = handle.clone();
    tokio::spawn(async move {
        let mut every = tokio::time::interval(UPKEEP);
        loop {
            every.tick().await;
            upkeep.run_upkeep();
        }
    });
    tokio::spawn(accept(listener, handle));
    Ok(local)
}

async fn accept(listener: TcpListener, handle: PrometheusHandle) {
    let slots = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            // EMFILE and the like: try again shortly rather than spin.
            tokio::time::sleep(Duration::from_millis(100)).await;
            continue;
        };
        let Ok(slot) = slots.clone().try_acquire_owned() else {
            // Closed at once: too many connections are open already.
            continue;
        };
        let handle = handle.clone();
        tokio::spawn(async move {
            let _ = tokio::time::timeout(CONNECTION_DEADLINE, respond(stream, &handle)).await;
            drop(slot);
        });
    }
}

async fn respond(mut stream: TcpStream, handle: &PrometheusHandle) -> std::io::Result<()> {
    let mut head = Vec::with_capacity(512);
    let mut buf = [0u8; 1024];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") && !head.windows(2).any(|w| w == b"\n\n") {
        if head.len() > MAX_REQUEST_HEAD {
            return reply(
                &mut stream,
                "431 Request Header Fields Too Large",
                "",
                false,
            )
            .await;
        }
        let n = stream.read(&mut buf).await?;
        if n == 0 {
            return Ok(());
        }
        head.extend_from_slice(&buf[..n]);
    }
    let line = head.split(|b| *b == b'\n').next().unwrap_or_default();
    let line = String::from_utf8_lossy(line);
    let mut parts = line.split_whitespace();
    let (method, target) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
    let path = target.split('?').next().unwrap_or("");
    let head_only = method == "HEAD";
    match (method, path) {
        ("GET" | "HEAD", "/metrics") => {
            let body = handle.render();
            reply(&mut stream, "200 OK", &body, head_only).await
        }
        ("GET" | "HEAD", _) => {
            reply(
                &mut stream,
                "404 Not Found",
                "kafka-lock serves its metrics at /metrics\n",
                head_only,
            )
            .await
        }
        _ => {
            reply(
                &mut stream,
                "405 Method Not Allowed",
                "GET or HEAD /metrics\n",
                false,
            )
            .await
        }
    }
}

async fn reply(
    stream: &mut TcpStream,
    status: &str,
    body: &str,
    head_only: bool,
) -> std::io::Result<()> {
    let mut out = format!(
        "HTTP/1.1 {status}\r\nContent-Type: text/plain; version=0.0.4; charset=utf-8\r\n\
         Content-Length: {}\r\nConnection: close\r\n",
        body.len()
    );
    if status.starts_with("405") {
        out.push_str("Allow: GET, HEAD\r\n");
    }
    out.push_str("\r\n");
    if !head_only {
        out.push_str(body);
    }
    stream.write_all(out.as_bytes()).await?;
    stream.shutdown().await
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One request, the answer as text.
    async fn ask(addr: SocketAddr, request: &str) -> String {
        let mut s = TcpStream::connect(addr).await.expect("connect");
        s.write_all(request.as_bytes()).await.expect("write");
        let mut out = String::new();
        s.read_to_string(&mut out).await.expect("read");
        out
    }

    #[tokio::test]
    async fn answers_get_head_unknown_paths_and_methods() {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let recorder = PrometheusBuilder::new().build_recorder();
        let handle = recorder.handle();
        metrics::with_local_recorder(&recorder, || {
            metrics::counter!("answers_total").increment(3);
        });
        tokio::spawn(accept(listener, handle));

        let got = ask(addr, "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n").await;
        assert!(got.starts_with("HTTP/1.1 200 OK\r\n"), "{got}");
        assert!(got.contains("\nanswers_total 3\n"), "{got}");
        let length: usize = got
            .lines()
            .find_map(|l| l.strip_prefix("Content-Length: "))
            .and_then(|n| n.trim().parse().ok())
            .expect("a length");
        assert_eq!(
            got.split_once("\r\n\r\n").map(|(_, b)| b.len()),
            Some(length)
        );

        let got = ask(addr, "HEAD /metrics?x=1 HTTP/1.0\r\n\r\n").await;
        assert!(
            got.starts_with("HTTP/1.1 200 OK\r\n") && got.ends_with("\r\n\r\n"),
            "{got}"
        );
        let got = ask(addr, "GET / HTTP/1.1\r\n\r\n").await;
        assert!(got.starts_with("HTTP/1.1 404 "), "{got}");
        let got = ask(addr, "POST /metrics HTTP/1.1\r\n\r\n").await;
        assert!(
            got.starts_with("HTTP/1.1 405 ") && got.contains("Allow: GET, HEAD"),
            "{got}"
        );
    }
}
