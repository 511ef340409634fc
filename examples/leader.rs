//! Leader election and an observer, with the library.
//!
//! ```text
//! leader BOOTSTRAP LOCK campaign     # lead for 10 s at a time, resign, campaign again (Ctrl-C stops)
//! leader BOOTSTRAP LOCK observe      # print the leader and every change
//! ```
//!
//! Start two or three `campaign`s and one `observe` against the same lock, then stop (or kill) the
//! leader and watch another take over with a greater token.

use std::time::Duration;

use kafka_lock::{Election, LockOptions};

#[tokio::main(flavor = "current_thread")]
async fn main() -> kafka_lock::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let [_, bootstrap, lock, mode] = args.as_slice() else {
        eprintln!("usage: leader BOOTSTRAP LOCK campaign|observe");
        std::process::exit(64);
    };
    let options = LockOptions::new(bootstrap, lock.clone())
        .label(format!("example pid {}", std::process::id()));
    match mode.as_str() {
        "campaign" => {
            let mut election = Election::new(options);
            loop {
                let leader = tokio::select! {
                    leader = election.campaign() => leader?,
                    _ = tokio::signal::ctrl_c() => return Ok(()),
                };
                println!("leading with token {}", leader.token());
                tokio::select! {
                    reason = leader.lost() => println!("lost the leadership: {reason}"),
                    _ = tokio::time::sleep(Duration::from_secs(10)) => {
                        leader.release().await?;
                        println!("resigned");
                    }
                    _ = tokio::signal::ctrl_c() => {
                        leader.release().await?;
                        return Ok(());
                    }
                }
            }
        }
        "observe" => {
            let mut observer = options.observer();
            loop {
                let l = observer.next().await?;
                match &l.leader {
                    Some(x) => println!(
                        "leader: {} ({}), generation {:?}",
                        x.member_id,
                        x.label.as_deref().unwrap_or("no label"),
                        x.generation
                    ),
                    None => println!("no leader ({})", l.state.as_str()),
                }
            }
        }
        other => {
            eprintln!("unknown mode {other:?}: campaign or observe");
            std::process::exit(64);
        }
    }
}
