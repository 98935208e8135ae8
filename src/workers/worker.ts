// A background worker of the process: started after the server listens,
// stopped (and awaited) before the database pool closes.
export interface Worker {
  start(): Promise<void> | void;
  stop(): Promise<void>;
}
