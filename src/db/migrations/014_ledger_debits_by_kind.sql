-- A renter's charges this month (the monthly spend quota, read at every
-- submit) are the debits of its accounts of the charge kinds. The debit index
-- (debit_account_id, created_at) also held every hold of the month, so the
-- quota read fetched each of them to look at its kind: the more jobs a renter
-- ran this month, the slower each submit. With the kind in the key the read
-- visits the charges only. It replaces the old index: reads by account alone
-- (account balances) use its leading column just as well.
CREATE INDEX ledger_transfers_debit_kind_idx ON ledger_transfers (debit_account_id, kind, created_at);
DROP INDEX ledger_transfers_debit_idx;
