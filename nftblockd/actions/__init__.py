"""Actions run when a ban or an unban is in the kernel: a command, a webhook, a fail2ban action.d file
(docs/actions.md). `template` and `render` are pure; `f2baction` reads action files; `runner` is the IO
edge (queues, workers, subprocesses, HTTP) the daemon feeds after each kernel commit."""
