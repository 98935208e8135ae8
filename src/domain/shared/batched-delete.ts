// How the retention sweep deletes: rows past their keeping go a bounded batch
// per statement, each statement a short transaction, so the writers of the
// table never wait long; the statement skips the rows another process is
// deleting (FOR UPDATE SKIP LOCKED), so several processes may sweep at once.

/** Rows deleted per statement. */
export const DELETE_BATCH = 10_000;

/** Runs `deleteBatch` (deleting at most DELETE_BATCH rows, answering how many) until a batch comes back short. */
export async function deleteInBatches(deleteBatch: (limit: number) => Promise<number>): Promise<number> {
  let total = 0;
  for (;;) {
    const n = await deleteBatch(DELETE_BATCH);
    total += n;
    if (n < DELETE_BATCH) return total;
  }
}
