"""Moving an existing setup to nftblockd: fail2ban's jails (`nftblock import-fail2ban-config`)."""
