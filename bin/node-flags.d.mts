/** The node flags the server runs with (bin/node-flags.mjs). */
export declare const SERVER_NODE_FLAGS: readonly string[];
