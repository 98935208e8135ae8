// What the domain reports of committed changes to whoever watches (the
// metrics at the edge subscribe; the domain never imports them). Reports go
// out after the transaction commits (afterCommit), so a rolled-back or re-run
// transaction is never counted. Values are from small fixed sets: no ids.
import { afterCommit, type Db } from "../../db/index.js";

export interface DomainObserver {
  /** Halala moved by one ledger transfer of this kind (hold, release, charge_provider, topup…). */
  ledgerMoved?(kind: string, halala: number): void;
  /** A job ended: its terminal status and end reason (settlement.ts). */
  jobSettled?(status: string, reason: string): void;
  /**
   * A group of submits committed (submit-batcher.ts): how long each submit waited for its group to
   * start (the group before it was in the database), and how long the group's transaction took.
   */
  submitGroup?(waitsSeconds: number[], writeSeconds: number): void;
}

const observers = new Set<DomainObserver>();

/** Subscribes an observer; returns the unsubscribe function. */
export function observeDomain(o: DomainObserver): () => void {
  observers.add(o);
  return () => {
    observers.delete(o);
  };
}

export function reportLedgerMoves(db: Db, moves: { kind: string; amount: number }[]): void {
  if (observers.size === 0 || moves.length === 0) return;
  afterCommit(db, () => {
    for (const o of observers) for (const m of moves) o.ledgerMoved?.(m.kind, m.amount);
  });
}

export function reportJobSettled(db: Db, status: string, reason: string): void {
  if (observers.size === 0) return;
  afterCommit(db, () => {
    for (const o of observers) o.jobSettled?.(status, reason);
  });
}

/** Called after the group's commit (the batcher's own transaction, not a caller's). */
export function reportSubmitGroup(waitsSeconds: number[], writeSeconds: number): void {
  for (const o of observers) o.submitGroup?.(waitsSeconds, writeSeconds);
}
