//! Two small primitives for what a lock keeps for its whole life: its commands to its session
//! and the end of its membership. A tokio `mpsc` channel costs about 800 bytes when made (its
//! 512-byte head, padded to cache lines, and a first block of 32 slots) and a `watch` about
//! 340; a held lock sends a command or two in its life and hears of its leave once, so with
//! many locks in one process these cost more than what they carry (BENCHMARKS.md, "Memory per
//! held lock"). Each here is one small allocation.

use std::collections::VecDeque;
use std::future::Future;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Poll, Waker};

use tokio::sync::Notify;

fn locked<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// An unbounded queue with one receiver, closed for the receiver once every sender is gone and
/// for the senders once the receiver is.
pub(crate) fn inbox<T>() -> (Sender<T>, Receiver<T>) {
    let shared = Arc::new(Shared {
        state: Mutex::new(State {
            queue: VecDeque::new(),
            senders: 1,
            receiver: true,
            waker: None,
        }),
    });
    (Sender(shared.clone()), Receiver(shared))
}

struct Shared<T> {
    state: Mutex<State<T>>,
}

struct State<T> {
    queue: VecDeque<T>,
    senders: usize,
    receiver: bool,
    /// The receiver's, while it waits: set and taken under the lock, so no wake-up is lost.
    waker: Option<Waker>,
}

pub(crate) struct Sender<T>(Arc<Shared<T>>);

impl<T> Sender<T> {
    /// Queues `value`; gives it back if the receiver is gone.
    pub(crate) fn send(&self, value: T) -> Result<(), T> {
        let mut state = locked(&self.0.state);
        if !state.receiver {
            return Err(value);
        }
        state.queue.push_back(value);
        let waker = state.waker.take();
        drop(state);
        if let Some(w) = waker {
            w.wake();
        }
        Ok(())
    }
}

impl<T> Clone for Sender<T> {
    fn clone(&self) -> Self {
        locked(&self.0.state).senders += 1;
        Sender(self.0.clone())
    }
}

impl<T> Drop for Sender<T> {
    fn drop(&mut self) {
        let mut state = locked(&self.0.state);
        state.senders -= 1;
        let waker = match state.senders {
            0 => state.waker.take(),
            _ => None,
        };
        drop(state);
        if let Some(w) = waker {
            w.wake();
        }
    }
}

impl<T> std::fmt::Debug for Sender<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sender").finish_non_exhaustive()
    }
}

pub(crate) struct Receiver<T>(Arc<Shared<T>>);

impl<T> Receiver<T> {
    /// The next value, or `None` once it is empty and every sender is gone. Cancel-safe: a
    /// value is taken only when this returns it. The future is a pointer: the session task
    /// keeps one in its own future for as long as it runs.
    pub(crate) fn recv(&mut self) -> impl Future<Output = Option<T>> + '_ {
        std::future::poll_fn(move |cx| {
            let mut state = locked(&self.0.state);
            if let Some(value) = state.queue.pop_front() {
                // A drained queue gives its storage back: it may sit empty for hours.
                if state.queue.is_empty() {
                    state.queue = VecDeque::new();
                }
                return Poll::Ready(Some(value));
            }
            if state.senders == 0 {
                return Poll::Ready(None);
            }
            match &mut state.waker {
                Some(w) if w.will_wake(cx.waker()) => {}
                w => *w = Some(cx.waker().clone()),
            }
            Poll::Pending
        })
    }
}

impl<T> Receiver<T> {
    /// The next value if one is queued, without waiting.
    #[cfg(test)]
    pub(crate) fn try_recv(&mut self) -> Option<T> {
        locked(&self.0.state).queue.pop_front()
    }
}

impl<T> Drop for Receiver<T> {
    fn drop(&mut self) {
        let mut state = locked(&self.0.state);
        state.receiver = false;
        let queued = std::mem::take(&mut state.queue);
        drop(state);
        // Outside the lock: a value's drop (a reply's sender) may wake others.
        drop(queued);
    }
}

/// How a membership ended, once it has: whether the coordinator confirmed that it has no
/// member for us any more. Set by the session's [`LeftSender`] (to "not confirmed" if it is
/// dropped unset), waited for by the lock's owner.
pub(crate) struct Left {
    left: Mutex<Option<bool>>,
    notify: Notify,
}

/// A new, unset end, with its one setter.
pub(crate) fn left() -> (LeftSender, Arc<Left>) {
    let end = Arc::new(Left {
        left: Mutex::new(None),
        notify: Notify::new(),
    });
    (LeftSender(end.clone()), end)
}

impl Left {
    /// Waits until the end is set and says whether the leave was confirmed.
    pub(crate) async fn wait(&self) -> bool {
        loop {
            let notified = self.notify.notified();
            tokio::pin!(notified);
            // Registered before the look, so a set between the two is not missed.
            notified.as_mut().enable();
            if let Some(confirmed) = *locked(&self.left) {
                return confirmed;
            }
            notified.await;
        }
    }
}

pub(crate) struct LeftSender(Arc<Left>);

impl LeftSender {
    /// Sets the end to `confirmed`; with `replace` false only if it is unset.
    pub(crate) fn set(&self, confirmed: bool, replace: bool) {
        let mut left = locked(&self.0.left);
        if left.is_some() && !replace {
            return;
        }
        *left = Some(confirmed);
        drop(left);
        self.0.notify.notify_waiters();
    }
}

impl Drop for LeftSender {
    fn drop(&mut self) {
        self.set(false, false);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    /// `f`'s output; a failure, not a hang, if it never comes.
    async fn soon<T>(f: impl Future<Output = T>) -> T {
        tokio::time::timeout(Duration::from_secs(10), f)
            .await
            .expect("never came")
    }

    #[tokio::test]
    async fn an_inbox_delivers_in_order_then_ends_with_its_last_sender() {
        let (tx, mut rx) = inbox();
        let tx2 = tx.clone();
        tx.send(1).unwrap();
        tx2.send(2).unwrap();
        assert_eq!(soon(rx.recv()).await, Some(1));
        drop(tx);
        assert_eq!(soon(rx.recv()).await, Some(2), "one sender is left");
        let waiter = tokio::spawn(async move { rx.recv().await });
        tokio::task::yield_now().await;
        drop(tx2);
        assert_eq!(soon(waiter).await.unwrap(), None);
    }

    #[tokio::test]
    async fn an_inbox_wakes_a_waiting_receiver_and_refuses_once_it_is_gone() {
        let (tx, mut rx) = inbox();
        let waiter = tokio::spawn(async move {
            let v = rx.recv().await;
            (v, rx)
        });
        tokio::task::yield_now().await;
        tx.send(7).unwrap();
        let (v, rx) = soon(waiter).await.unwrap();
        assert_eq!(v, Some(7));
        tx.send(8).unwrap();
        drop(rx);
        assert_eq!(tx.send(9), Err(9));
    }

    /// What is queued when the receiver goes is dropped with it, not kept by the senders: a
    /// checkpoint's reply queued for a session that ended fails its caller instead of leaving
    /// it waiting, and so does one sent after.
    #[tokio::test]
    async fn an_inbox_drops_what_is_queued_when_its_receiver_goes() {
        let (tx, rx) = inbox();
        let (reply, answer) = tokio::sync::oneshot::channel::<()>();
        tx.send(reply).unwrap();
        drop(rx);
        assert!(
            soon(answer).await.is_err(),
            "a reply queued for a receiver that is gone"
        );
        let (reply, answer) = tokio::sync::oneshot::channel::<()>();
        let Err(back) = tx.send(reply) else {
            panic!("sent to a receiver that is gone");
        };
        drop(back);
        assert!(soon(answer).await.is_err());
    }

    /// A receiver polled once and dropped there (a `select!` whose other arm won), then waited
    /// on elsewhere, is woken where it waits now: the waker of the earlier poll is replaced.
    #[tokio::test]
    async fn an_inbox_wakes_the_receiver_where_it_waits_now_not_where_it_was_polled_before() {
        let (tx, mut rx) = inbox();
        {
            let mut cx = std::task::Context::from_waker(Waker::noop());
            let recv = std::pin::pin!(rx.recv());
            assert!(recv.poll(&mut cx).is_pending());
        }
        let (waiting_tx, waiting) = tokio::sync::oneshot::channel();
        let waiter = tokio::spawn(async move {
            let mut waiting_tx = Some(waiting_tx);
            let mut recv = std::pin::pin!(rx.recv());
            std::future::poll_fn(|cx| {
                let polled = recv.as_mut().poll(cx);
                if polled.is_pending() {
                    if let Some(w) = waiting_tx.take() {
                        let _ = w.send(());
                    }
                }
                polled
            })
            .await
        });
        soon(waiting).await.unwrap();
        tx.send(1).unwrap();
        assert_eq!(soon(waiter).await.unwrap(), Some(1));
    }

    /// Sends from another thread race the receiver's polls in a `select!` whose other arm (the
    /// session's answers, its timers) often wins, so that its future is dropped and made again
    /// as the session task's is: every value arrives, in order, and none waits for a later wake.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_inbox_loses_no_wake_up_to_sends_racing_a_receiver_in_a_select() {
        const ROUNDS: u32 = 20_000;
        let (tx, mut rx) = inbox();
        let (other_tx, mut other) = tokio::sync::mpsc::unbounded_channel();
        let (ack_tx, mut ack) = tokio::sync::mpsc::unbounded_channel();
        let sender = tokio::spawn(async move {
            for i in 0..ROUNDS {
                if i % 2 == 0 {
                    other_tx.send(()).unwrap();
                }
                tx.send(i).unwrap();
                soon(ack.recv()).await.unwrap();
            }
        });
        let mut next = 0;
        while next < ROUNDS {
            soon(async {
                tokio::select! {
                    biased;
                    Some(()) = other.recv() => {}
                    v = rx.recv() => {
                        assert_eq!(v, Some(next));
                        next += 1;
                        ack_tx.send(()).unwrap();
                    }
                }
            })
            .await;
        }
        soon(sender).await.unwrap();
    }

    #[tokio::test]
    async fn a_left_wakes_its_waiter_keeps_a_set_value_and_is_unconfirmed_when_dropped() {
        let (tx, end) = left();
        let waiter = {
            let end = end.clone();
            tokio::spawn(async move { end.wait().await })
        };
        tokio::task::yield_now().await;
        tx.set(true, true);
        assert!(soon(waiter).await.unwrap());
        tx.set(false, false);
        assert!(soon(end.wait()).await, "a value set stays unless replaced");
        drop(tx);
        assert!(
            soon(end.wait()).await,
            "dropping the setter keeps what was set"
        );

        let (tx, end) = left();
        drop(tx);
        assert!(!soon(end.wait()).await, "dropped unset: not confirmed");
    }
}
