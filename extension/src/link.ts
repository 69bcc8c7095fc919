/**
 * One kernel's end of the data path: the `torchtpu_lab` comm.
 *
 * The kernel opens the comm when `%load_ext torchtpu_lab` runs (we register the comm target before that can
 * happen). After a page reload the comm is already open in the kernel: we find it with a `comm_info` request
 * and attach to it. We never open a comm to a kernel that has not announced one, so kernels without
 * torchtpu_lab see no traffic at all and the status bar item stays hidden.
 */

import { Kernel, KernelMessage } from '@jupyterlab/services';
import { ISignal, Signal } from '@lumino/signaling';

import { COMM_TARGET, Command, Compiling, makeRequest, parseKernelMessage, Status } from './model';

const POLL_MS = 4000;
let linkCounter = 0;

export class KernelLink {
  constructor(kernel: Kernel.IKernelConnection) {
    this.kernel = kernel;
    this._prefix = `${Date.now().toString(36)}-${(linkCounter++).toString(36)}`;
    kernel.registerCommTarget(COMM_TARGET, this._target);
    kernel.statusChanged.connect(this._onKernelStatus, this);
    this._timer = setInterval(() => this._poll(), POLL_MS);
    void this._probe();
  }

  readonly kernel: Kernel.IKernelConnection;

  /** The latest status from the kernel, or `null` when torchtpu_lab is not loaded there. */
  get status(): Status | null {
    return this._status;
  }

  /** The XLA compile running in the kernel now (announced after a moment; `null` when none is). */
  get compiling(): Compiling | null {
    return this._compiling;
  }

  /** The outcome of the last button action (a reply message or an error), as plain text. */
  get lastMessage(): string {
    return this._lastMessage;
  }

  get changed(): ISignal<this, void> {
    return this._changed;
  }

  get isDisposed(): boolean {
    return this._disposed;
  }

  /** Send one of the fixed commands; a no-op when no comm is open. */
  request(command: Command, mode?: string): void {
    if (!this._comm || this._comm.isDisposed) {
      return;
    }
    const id = `${this._prefix}-${this._seq++}`;
    const payload = makeRequest(id, command, mode);
    this._pending.set(id, Date.now());
    try {
      this._comm.send({ ...payload } as any);
    } catch (e) {
      this._pending.delete(id);
      this._drop();
    }
  }

  dispose(): void {
    if (this._disposed) {
      return;
    }
    this._disposed = true;
    clearInterval(this._timer);
    try {
      this.kernel.removeCommTarget(COMM_TARGET, this._target);
    } catch {
      // the kernel connection may already be gone
    }
    this.kernel.statusChanged.disconnect(this._onKernelStatus, this);
    this._comm = null;
    this._status = null;
    Signal.clearData(this);
  }

  private async _probe(): Promise<void> {
    try {
      const reply = await this.kernel.requestCommInfo({ target_name: COMM_TARGET });
      const content = reply.content as KernelMessage.ICommInfoReply;
      if (this._disposed || this._comm || content.status !== 'ok') {
        return;
      }
      const ids = Object.keys(content.comms || {}).filter(
        id => (content.comms[id] as any)?.target_name === COMM_TARGET
      );
      if (ids.length && !this.kernel.hasComm(ids[0])) {
        this._attach(this.kernel.createComm(COMM_TARGET, ids[0]));
        this.request('status');
      }
    } catch {
      // a kernel that is dead, restarting or does not answer comm_info: nothing to show
    }
  }

  private _attach(comm: Kernel.IComm): void {
    if (this._disposed) {
      return;
    }
    this._comm = comm;
    comm.onMsg = (msg: KernelMessage.ICommMsgMsg) => {
      if (this._comm === comm) {
        this._handle(msg.content.data);
      }
    };
    comm.onClose = () => {
      if (this._comm === comm) {
        this._drop();
      }
    };
  }

  private _handle(data: unknown): void {
    const msg = parseKernelMessage(data);
    switch (msg.type) {
      case 'status':
        this._setStatus(msg.status);
        break;
      case 'compile':
        // the kernel counts from the compile's start; we count on from there with our own clock
        this._compiling = msg.phase === 'start' ? { kind: msg.kind, since: Date.now() - 1000 * msg.seconds } : null;
        break;
      case 'reply':
        if (msg.id) {
          this._pending.delete(msg.id);
        }
        if (msg.status) {
          this._setStatus(msg.status);
        }
        if (msg.command !== 'status' && msg.id?.startsWith(this._prefix)) {
          this._lastMessage = msg.message;
        }
        break;
      case 'error':
        if (msg.id) {
          this._pending.delete(msg.id);
        }
        this._lastMessage = `error: ${msg.error}`;
        break;
      case 'unloaded':
        this._status = null;
        this._compiling = null;
        break;
      case 'invalid':
        console.warn(`torchtpu-lab: ignored a comm message (${msg.reason})`);
        return;
    }
    this._changed.emit();
  }

  /** A status says whether a compile runs right now: it replaces what the compile messages said (so a lost
   *  `end`, say after an interrupt, cannot leave "compiling…" showing). */
  private _setStatus(status: Status): void {
    this._status = status;
    const c = status.compiling;
    const since = c ? Date.now() - 1000 * c.seconds : 0;
    this._compiling = c ? { kind: c.kind, since: this._compiling ? Math.min(this._compiling.since, since) : since } : null;
  }

  private _drop(): void {
    this._comm = null;
    this._status = null;
    this._compiling = null;
    this._pending.clear();
    this._changed.emit();
  }

  private _onKernelStatus(_: Kernel.IKernelConnection, status: Kernel.Status): void {
    if (status === 'restarting' || status === 'autorestarting' || status === 'dead') {
      if (this._comm || this._status) {
        this._drop();
      }
    }
  }

  /** Between cells, ask for a fresh status now and then (never queues behind a running cell). */
  private _poll(): void {
    const now = Date.now();
    for (const [id, t] of this._pending) {
      if (now - t > 30000) {
        this._pending.delete(id); // lost (e.g. the kernel was interrupted): do not wait for it forever
      }
    }
    if (this._comm && this.kernel.status === 'idle' && this._pending.size === 0) {
      this.request('status');
    }
  }

  private _comm: Kernel.IComm | null = null;
  private _status: Status | null = null;
  private _compiling: Compiling | null = null;
  private _lastMessage = '';
  private _seq = 0;
  private _prefix: string;
  private _pending = new Map<string, number>();
  private _target = (comm: Kernel.IComm): void => this._attach(comm);
  private _timer: ReturnType<typeof setInterval>;
  private _disposed = false;
  private _changed = new Signal<this, void>(this);
}
