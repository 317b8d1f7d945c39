// A FIFO with O(1) shift, for inboxes and outboxes that can grow to thousands of entries.
export class Queue<T> {
  #items: (T | undefined)[] = [];
  #head = 0;

  get length(): number {
    return this.#items.length - this.#head;
  }
  push(item: T): void {
    this.#items.push(item);
  }
  peek(): T | undefined {
    return this.#items[this.#head];
  }
  peekLast(): T | undefined {
    return this.length > 0 ? this.#items[this.#items.length - 1] : undefined;
  }
  shift(): T | undefined {
    if (this.#head >= this.#items.length) return undefined;
    const item = this.#items[this.#head];
    this.#items[this.#head++] = undefined;
    if (this.#head > 1024 && this.#head * 2 > this.#items.length) {
      this.#items = this.#items.slice(this.#head);
      this.#head = 0;
    }
    return item;
  }
  /** Removes and returns everything. */
  drain(): T[] {
    const all = this.#items.slice(this.#head) as T[];
    this.#items = [];
    this.#head = 0;
    return all;
  }
}

/** The callbacks of a promise waiting on a queue (a receive, a flush, a handshake). */
export interface Waiter {
  resolve(value: unknown): void;
  reject(error: unknown): void;
}
