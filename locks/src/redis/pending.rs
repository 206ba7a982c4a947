//! A request whose caller may give up on it halfway: the connection it ran
//! on is then in an unknown state, and whoever owns it must forget it.

/// A request in flight: dropped before [`answered`] (its caller gave up on
/// it), it runs `on_abandon`. See `Server::answer`.
pub(super) type Unanswered<F> = scopeguard::ScopeGuard<(), F>;

/// See [`Unanswered`].
pub(super) fn unanswered(on_abandon: impl FnOnce()) -> Unanswered<impl FnOnce(())> {
    scopeguard::guard((), move |()| on_abandon())
}

/// The request got an answer (or an error that was dealt with): defuse.
pub(super) fn answered<F: FnOnce(())>(pending: Unanswered<F>) {
    scopeguard::ScopeGuard::into_inner(pending);
}
