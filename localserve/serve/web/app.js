// localserve's chat page. It speaks the websocket protocol of docs/protocol.md: hello, chat,
// cancel; queued, token, done, error, notice; and on a server with users the conversation
// frames. Conversations live on such a server, for their person only (so another browser or a
// phone shows the same list), and otherwise in this browser's localStorage; every turn sends
// the whole conversation (the server's prefix cache makes the earlier turns cheap). Model text is untrusted: it is rendered as Markdown with raw HTML shown
// as text, only http(s) and mailto links, and DOMPurify over the result; the page's
// Content-Security-Policy allows no inline script on top of that.
"use strict";

(() => {
  const KEY = "localserve.v1.";
  const DEFAULTS = { temperature: 0.8, max_tokens: 1024 };  // max_tokens: lowered to the server's cap
  const HEALTH_EVERY_MS = 2000;
  const HEALTH_HIDDEN_MS = 10000;
  const RENDER_EVERY_MS = 40;
  const MODELS_POLL_MS = 1500;  // the picker asks the models again this often while one loads
  const PLACEHOLDER = "Message (Enter sends, Shift+Enter: new line)";
  const $ = (id) => document.getElementById(id);

  const state = {
    identity: null,    // {user, token}
    settings: { ...DEFAULTS },
    chats: [],         // [{id, title, created, messages: [{role, content, ...}]}]
    current: null,     // chat id
    ws: null,
    welcome: null,     // the welcome frame while signed in
    halted: false,     // no reconnecting until the person signs in again
    retryMs: 1000,
    reconnectTimer: null,
    pending: new Map(), // request id -> {chat, msg}
    health: null,
    healthError: null,
    dirty: new Set(),  // messages to re-render
    renderTimer: null,
    renderEvery: RENDER_EVERY_MS,
    nodes: new WeakMap(), // message -> its element
    quotaUntil: null,  // {at: ms, shown: "HH:MM"} while the daily quota is used up: no sending
    quotaTimer: null,
    quotaNotice: false, // the notice shows the welcome's quota line
    remote: false,     // the server keeps this person's conversations (its welcome says so)
    saving: new Map(), // chat id -> {again}: a save sent, not answered yet
    listed: false,     // the server's list has arrived since the welcome
    listing: null,     // its pages so far, while they come
    deleting: new Set(), // ids deleted here that the server has not confirmed
    models: [],        // the server's `models` frame's list: each model's state and cost
    countdownTimer: null, // while a reply waits with a predicted wait: its next second
    modelsTimer: null, // asks again while a model loads
    modelsShown: "",   // what the picker's options were built from
  };

  // --- storage ----------------------------------------------------------------------------------

  function load(name, fallback) {
    try {
      const text = localStorage.getItem(KEY + name);
      return text === null ? fallback : JSON.parse(text);
    } catch (e) {
      return fallback;
    }
  }

  function save(name, value) {
    try {
      localStorage.setItem(KEY + name, JSON.stringify(value));
      return true;
    } catch (e) {
      showNotice("This browser's storage is full: delete old conversations to keep new ones.", true);
      return false;
    }
  }

  // One key per conversation, under the person's name ("chat.<name>.<id>"): people sharing a
  // browser do not see each other's, and two tabs of one person overwrite nothing but the
  // conversation both changed (each writes only its own changes; the other tab hears of them).
  const userPart = () => (state.identity ? state.identity.user : "");
  const chatPrefix = () => `chat.${userPart()}.`;
  const currentKey = () => `current.${userPart()}`;

  function saveChat(chat) {
    if (!state.chats.includes(chat)) return;  // deleted meanwhile
    if (!state.remote) return save(chatPrefix() + chat.id, chat);
    keepUnsaved(chat);  // until the server says it has it
    pushChat(chat);
    renderChats();
  }

  function parseChat(text) {
    let chat;
    try { chat = JSON.parse(text); } catch (e) { return null; }
    return checkChat(chat);
  }

  function checkChat(chat) {  // from storage or the server: only what this page can show
    if (!chat || typeof chat.id !== "string" || !Array.isArray(chat.messages)) return null;
    if (typeof chat.model !== "string" || !chat.model) delete chat.model;  // older: the default
    chat.messages = chat.messages.filter(
      (m) => m && (m.role === "user" || m.role === "assistant") && typeof m.content === "string");
    for (const m of chat.messages) {  // a reply that was coming when its page closed
      if (m.reasoning !== undefined && typeof m.reasoning !== "string") delete m.reasoning;
      if (m.role === "assistant" && LIVE.includes(m.status)) {
        m.status = "interrupted";
        m.error = state.remote ? "this reply was still coming when it was last saved (on " +
          "another device, or when the server or the page stopped)"
          : "the page was closed while this reply was coming";
      }
    }
    return chat;
  }

  function loadIdentity() {
    const identity = load("identity", null);
    if (identity && typeof identity.user === "string" && identity.user) state.identity = identity;
    const settings = load("settings", {});
    const t = settings.temperature;
    if (Number.isFinite(t) && t >= 0 && t <= 2) state.settings.temperature = t;
    if (Number.isInteger(settings.max_tokens) && settings.max_tokens >= 1) {
      state.settings.max_tokens = settings.max_tokens;
    }
  }

  function loadChats() {
    const prefix = KEY + chatPrefix();
    const chats = [];
    for (let i = 0; i < localStorage.length; i++) {
      const key = localStorage.key(i);
      if (!key.startsWith(prefix) || key.slice(prefix.length).includes(".")) continue;
      const chat = parseChat(localStorage.getItem(key));
      if (chat) chats.push(Object.assign(chat, { loaded: true }));
    }
    state.chats = chats.sort((a, b) => (b.created || 0) - (a.created || 0));
    state.current = load(currentKey(), null);
    if (!state.chats.some((c) => c.id === state.current)) state.current = state.chats[0]?.id ?? null;
  }

  function onStorage(event) {  // another tab of this page changed something
    if (state.remote) return;  // the server tells every tab of its changes
    const prefix = KEY + chatPrefix();
    if (!event.key || !event.key.startsWith(prefix)) return;
    const id = event.key.slice(prefix.length);
    const mine = state.chats.find((c) => c.id === id);
    if (mine && replyInFlight(mine)) return;  // this tab's reply is coming: this tab's copy wins
    const theirs = event.newValue === null ? null : parseChat(event.newValue);
    state.chats = state.chats.filter((c) => c.id !== id);
    if (theirs) {
      state.chats.push(Object.assign(theirs, { loaded: true }));
      state.chats.sort((a, b) => (b.created || 0) - (a.created || 0));
    }
    if (state.current === id && !theirs) state.current = state.chats[0]?.id ?? null;
    renderChats();
    if (state.current === id) renderMessages();
  }

  // --- conversations on the server ------------------------------------------------------------

  // On a server with users, the server keeps each person's conversations: the list comes from
  // it (in pages) at each welcome, a conversation's messages when it is opened, and every change
  // is saved whole, from the revision it was made of. Until the server says it has a change, the
  // conversation is marked unsaved, kept in this browser too (a reload or a closed tab loses
  // nothing) and sent again after a reconnect. A copy older than the server's (another device
  // saved meanwhile) is kept as a conversation of its own rather than lost. What this browser
  // kept for the person before the server had users is moved to the server, then removed here.

  const KEPT = ["role", "content", "status", "error", "finish", "usage", "timings", "reasoning",
                "model"];
  const wellFormed = (s) => (typeof s === "string" && s.toWellFormed ? s.toWellFormed() : s);
  const storedMessage = (m) => Object.fromEntries(KEPT.filter((k) => m[k] !== undefined && m[k] !== null)
    .map((k) => [k, wellFormed(m[k])]));
  const cut = (s, n) => Array.from(s).slice(0, n).join("");  // by characters, not UTF-16 units

  function stored(chat) {  // what the server keeps of a conversation
    const kept = { id: chat.id, title: wellFormed(chat.title || "New chat"),
                   created: chat.created || 0, messages: chat.messages.map(storedMessage) };
    if (chat.model) kept.model = chat.model;
    return kept;
  }

  function keepUnsaved(chat) {  // this browser's copy until the server has it
    chat.unsaved = true;
    save(chatPrefix() + chat.id, { ...chat, fromBrowser: undefined, requested: undefined });
  }

  function pushChat(chat) {
    if (!state.welcome || !state.listed || !chat.loaded) return;  // sent at the next welcome
    if (!state.chats.includes(chat)) return;  // deleted meanwhile
    const saving = state.saving.get(chat.id);
    if (saving) { saving.again = true; return; }  // one save at a time per conversation
    const frame = { type: "save_conversation", conversation: stored(chat),
                    base_revision: chat.revision ?? null };
    const text = JSON.stringify(frame);
    const limit = state.welcome.limits?.max_frame_bytes;
    if (limit && new TextEncoder().encode(text).length > limit) {
      return notSaved({ id: chat.id, message: `it is longer than the server takes ` +
                        `(${Math.floor(limit / 1024)} KiB): export it to keep it` });
    }
    if (state.ws && state.ws.readyState === WebSocket.OPEN) {
      state.ws.send(text);
      state.saving.set(chat.id, { again: false });
    }
  }

  function pushUnsaved() {
    for (const chat of state.chats) if (chat.unsaved && !state.saving.has(chat.id)) pushChat(chat);
  }

  function requestChat(chat) {
    if (chat.requested || !state.welcome) return;
    chat.requested = true;
    send({ type: "get_conversation", id: chat.id });
  }

  function stub(summary) {  // a conversation the server has, its messages not fetched yet
    return { id: summary.id, title: summary.title, created: summary.created,
             revision: summary.revision, messages: [], loaded: false };
  }

  function welcomeRemote() {  // a welcome on a server that keeps conversations
    for (const id of state.deleting) send({ type: "delete_conversation", id });
    state.listing = [];
    send({ type: "list_conversations" });
  }

  function onListPage(frame) {  // pages of 100 summaries, asked for one after another
    if (!state.listing) return;
    state.listing.push(...(frame.conversations || []));
    const next = (frame.offset || 0) + (frame.conversations || []).length;
    if (next < (frame.total || 0) && (frame.conversations || []).length) {
      return send({ type: "list_conversations", offset: next });
    }
    const whole = state.listing.filter((s) => !state.deleting.has(s.id));
    state.listing = null;
    onList(whole);
  }

  function onList(summaries) {
    const mine = new Map(state.chats.map((c) => [c.id, c]));
    const chats = [];
    for (const summary of summaries) {
      const here = mine.get(summary.id);
      mine.delete(summary.id);
      // this page's copy, when it is newer (not saved yet) or the same revision
      if (here && here.loaded && (here.unsaved || here.revision === summary.revision)) chats.push(here);
      else chats.push(stub(summary));
    }
    for (const chat of mine.values()) if (chat.unsaved) chats.push(chat);  // new here, unsaved
    state.chats = chats;
    state.listed = true;
    const moved = fromBrowser(new Set(summaries.map((s) => s.id)), new Set(chats.map((c) => c.id)));
    sortChats();
    if (!state.chats.some((c) => c.id === state.current)) {
      state.current = load(currentKey(), null);
      if (!state.chats.some((c) => c.id === state.current)) state.current = state.chats[0]?.id ?? null;
    }
    pushUnsaved();
    if (currentChat() && !currentChat().loaded) requestChat(currentChat());
    if (moved) showNotice(`Moving ${moved} conversation${moved > 1 ? "s" : ""} kept in this ` +
                          "browser to the server: they will follow you to your other devices.");
    renderAll();
  }

  // What this browser keeps of the person: copies not yet saved (sent again now) and, from
  // before the server had users, conversations to move there. Returns how many are moved.
  function fromBrowser(onServer, shown) {
    const prefix = KEY + chatPrefix();
    let moved = 0;
    for (const key of Object.keys(localStorage)) {
      if (!key.startsWith(prefix) || key.slice(prefix.length).includes(".")) continue;
      const chat = parseChat(localStorage.getItem(key));
      if (!chat) continue;
      if (shown.has(chat.id)) {  // this page has it (on the server, or on its way there)
        if (onServer.has(chat.id) && !state.chats.find((c) => c.id === chat.id)?.unsaved) {
          try { localStorage.removeItem(key); } catch (e) { /* next time */ }
        }
        continue;
      }
      Object.assign(chat, { loaded: true, unsaved: true });
      state.chats.push(chat);
      if (chat.revision === undefined) moved++;  // never on the server: moved there now
    }
    return moved;
  }

  function onSaved(frame) {
    const summary = frame.summary || {};
    const chat = state.chats.find((c) => c.id === summary.id);
    if (frame.here) {
      const saving = state.saving.get(summary.id);
      state.saving.delete(summary.id);
      if (!chat) return;
      chat.revision = summary.revision;
      if (saving && saving.again) return pushChat(chat);  // changed again meanwhile
      chat.unsaved = false;
      try { localStorage.removeItem(KEY + chatPrefix() + chat.id); } catch (e) { /* later */ }
      if (state.noticeFor === chat.id) { showNotice(null); state.noticeFor = null; }  // saved now
      return renderChats();
    }
    // another browser of this person saved it
    if (!chat) {
      state.chats.push(stub(summary));
    } else if (chat.revision !== summary.revision && !chat.unsaved && !replyInFlight(chat)) {
      Object.assign(chat, { title: summary.title, revision: summary.revision, loaded: false,
                            requested: false });
      if (chat.id === state.current) requestChat(chat);
    }
    sortChats();
    renderAll();
  }

  function onFound(frame) {
    const summary = frame.summary || {};
    const chat = state.chats.find((c) => c.id === summary.id);
    const found = checkChat(frame.conversation);
    if (!chat || !found || chat.loaded) return;  // deleted meanwhile, or changed here
    Object.assign(chat, { title: found.title, created: found.created, messages: found.messages,
                          model: found.model,
                          revision: summary.revision, loaded: true, requested: false });
    if (chat.id === state.current) renderAll();
  }

  function onDeleted(id) {  // deleted in another browser of this person (or gone already)
    const chat = state.chats.find((c) => c.id === id);
    if (chat) forget(chat);
  }

  // Another device saved the conversation since this copy was made: this copy becomes a
  // conversation of its own (nothing typed here is lost), the original is fetched again.
  function onConflict(frame) {
    state.saving.delete(frame.id);
    const chat = state.chats.find((c) => c.id === frame.id);
    if (!chat) return;
    try { localStorage.removeItem(KEY + chatPrefix() + chat.id); } catch (e) { /* later */ }
    const copy = { ...chat, id: `c${Date.now().toString(36)}${randomId(4)}`, revision: undefined,
                   title: cut(`${chat.title || "New chat"} (this device)`, 200) };
    for (const p of state.pending.values()) if (p.chat === chat) p.chat = copy;
    Object.assign(chat, { loaded: false, requested: false, unsaved: false, messages: [] });
    state.chats.push(copy);
    if (state.current === chat.id) state.current = copy.id;
    sortChats();
    keepUnsaved(copy);
    pushChat(copy);
    showNotice(`“${chat.title || "New chat"}” was changed on another device meanwhile: this ` +
               `page's copy is kept as “${copy.title}”.`, true);
    renderAll();
  }

  function notSaved(frame) {
    state.saving.delete(frame.id);
    const chat = state.chats.find((c) => c.id === frame.id);
    const name = chat ? `“${chat.title || "New chat"}”` : "A conversation";
    showNotice(`${name} is not saved on the server (this browser keeps it until it is): ` +
               `${String(frame.message || "").replace(/^not saved: /, "")}`, true);
    state.noticeFor = frame.id;
    renderChats();
  }

  function notFound(frame) {  // a conversation the server could not read
    const chat = state.chats.find((c) => c.id === frame.id);
    if (chat && !chat.loaded) chat.requested = false;  // asked again when opened again
    showNotice(`The server could not open this conversation: ${frame.message}`, true);
  }

  function sortChats() {
    state.chats.sort((a, b) => (b.created || 0) - (a.created || 0));
  }

  // --- export -----------------------------------------------------------------------------------

  function download(name, type, text) {
    const url = URL.createObjectURL(new Blob([text], { type }));
    const a = document.createElement("a");
    a.href = url;
    a.download = name;
    document.body.append(a);
    a.click();
    a.remove();
    setTimeout(() => URL.revokeObjectURL(url), 1000);
  }

  function fileName(chat, ext) {
    const base = (chat.title || "conversation").replace(/[^\p{L}\p{N}]+/gu, "-").replace(/^-|-$/g, "");
    return `${base.slice(0, 60) || "conversation"}.${ext}`;
  }

  function asMarkdown(chat) {
    const model = chatModel(chat) || "the model";
    const person = state.identity?.user || "you";
    const when = new Date(chat.created || Date.now()).toLocaleString("en-GB");
    const parts = [`# ${chat.title || "New chat"}`, "", `_${person} with ${model}, started ${when}_`];
    for (const m of chat.messages) {
      if (!m.content && m.role === "assistant") continue;  // a reply that never came
      parts.push("", `## ${m.role === "user" ? person : m.model || model}`, "", m.content);
      if (m.role === "assistant" && m.status && m.status !== "done") parts.push("", `_(${m.status})_`);
    }
    return parts.join("\n") + "\n";
  }

  function asJson(chat) {
    const messages = chat.messages.filter((m) => m.content || m.role === "user").map(storedMessage);
    const created = new Date(chat.created || 0);
    return JSON.stringify({ id: chat.id, title: chat.title,
                            created: Number.isNaN(created.getTime()) ? null : created.toISOString(),
                            user: state.identity?.user ?? null, model: chatModel(chat) || null,
                            messages }, null, 2) + "\n";
  }

  function exportChat(kind) {
    const chat = currentChat();
    if (!chat || !chat.loaded) return;
    if (kind === "md") download(fileName(chat, "md"), "text/markdown", asMarkdown(chat));
    else download(fileName(chat, "json"), "application/json", asJson(chat));
  }

  // --- formatting -------------------------------------------------------------------------------

  const ESCAPES = { "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" };
  const UNESCAPES = Object.fromEntries(Object.entries(ESCAPES).map(([k, v]) => [v, k]));
  const escapeHtml = (s) => String(s).replace(/[&<>"']/g, (c) => ESCAPES[c]);
  // marked hands some addresses, titles and labels over already escaped: escape exactly once
  const reescape = (s) => escapeHtml(String(s).replace(/&(amp|lt|gt|quot|#39);/g, (e) => UNESCAPES[e]));
  const LIVE = ["sending", "queued", "streaming", "stopping"];
  const SAFE_URL = /^(https?:\/\/|mailto:)/i;

  function ordinal(n) {
    const tens = n % 100;
    const suffix = tens >= 11 && tens <= 13 ? "th" : ({ 1: "st", 2: "nd", 3: "rd" }[n % 10] || "th");
    return `${n}${suffix}`;
  }

  function ms(value) {
    if (value === null || value === undefined) return "–";
    return value < 1000 ? `${Math.round(value)} ms` : `${(value / 1000).toFixed(1)} s`;
  }

  let markdown = null;  // set up once the vendored libraries have loaded

  function setUpMarkdown() {
    const renderer = new marked.Renderer();
    renderer.html = (html) => escapeHtml(html);  // raw HTML in a reply is shown, never parsed
    renderer.link = (href, title, text) => {
      const url = (href || "").trim();
      if (!SAFE_URL.test(url)) return `${text} (${reescape(url)})`;
      const t = title ? ` title="${reescape(title)}"` : "";
      return `<a href="${reescape(url)}"${t}>${text}</a>`;
    };
    renderer.image = (href, title, text) => {  // never loaded (the CSP forbids it): a link
      const url = (href || "").trim();
      const label = `image: ${reescape(text || url)}`;
      return SAFE_URL.test(url) ? `<a href="${reescape(url)}">[${label}]</a>` : `[${label}]`;
    };
    renderer.checkbox = (checked) => (checked ? "☑ " : "☐ ");  // task lists, without inputs
    marked.setOptions({ gfm: true, breaks: true, headerIds: false, mangle: false, renderer });
    DOMPurify.addHook("afterSanitizeAttributes", (node) => {
      if (node.tagName === "A") {
        node.setAttribute("target", "_blank");
        node.setAttribute("rel", "noopener noreferrer nofollow");
      }
    });
    const config = {
      FORBID_TAGS: ["style", "form", "input", "button", "textarea", "select", "iframe", "img"],
      FORBID_ATTR: ["style", "id", "class", "srcset"],
      ALLOWED_URI_REGEXP: /^(?:https?:\/\/|mailto:)/i,
    };
    // a fragment, not a string: what was sanitized is what is shown, never parsed again
    markdown = (text) => DOMPurify.sanitize(marked.parse(text), { ...config, RETURN_DOM_FRAGMENT: true });
  }

  // --- conversations ----------------------------------------------------------------------------

  function currentChat() {
    return state.chats.find((c) => c.id === state.current) || null;
  }

  function newChat() {
    const chat = { id: `c${Date.now().toString(36)}${randomId(4)}`, title: "New chat",
                   created: Date.now(), messages: [], loaded: true };
    state.chats.unshift(chat);
    state.current = chat.id;
    if (!state.remote) saveChat(chat);  // on the server: once it has a message
    save(currentKey(), state.current);
    renderAll();
    $("input").focus();
    return chat;
  }

  function deleteChat(chat) {
    // on the server (or on its way there): the delete is sent again at the next welcome until
    // the server confirms it
    if (state.remote && (chat.revision !== undefined || state.saving.has(chat.id))) {
      state.deleting.add(chat.id);
      send({ type: "delete_conversation", id: chat.id });
    }
    try { localStorage.removeItem(KEY + chatPrefix() + chat.id); } catch (e) { /* gone anyway */ }
    forget(chat);
  }

  function forget(chat) {
    for (const [id, p] of state.pending) {
      if (p.chat === chat) { cancel(id); state.pending.delete(id); }  // its end saves nothing
    }
    state.chats = state.chats.filter((c) => c !== chat);
    state.saving.delete(chat.id);
    if (state.current === chat.id) state.current = state.chats[0]?.id ?? null;
    save(currentKey(), state.current);
    if (currentChat() && !currentChat().loaded) requestChat(currentChat());
    renderAll();
  }

  function renameChat(chat, title) {
    title = cut(title.trim(), 200);
    if (!title || title === chat.title) return;
    chat.title = title;
    saveChat(chat);  // whole, like any change (a rename frame would race a save)
    renderAll();
  }

  function randomId(n) {
    const bytes = new Uint8Array(n);
    crypto.getRandomValues(bytes);
    return Array.from(bytes, (b) => b.toString(16).padStart(2, "0")).join("");
  }

  function replyInFlight(chat) {
    for (const p of state.pending.values()) if (p.chat === chat) return p.msg;
    return null;
  }

  // --- the connection ---------------------------------------------------------------------------

  // `next`: a name (and token) to sign in as; it replaces the current one only once the server
  // welcomes it, so a refused name shows none of its conversations
  function connect(next) {
    clearTimeout(state.reconnectTimer);
    if (next) state.trying = next;
    const who = state.trying || state.identity;
    if (!who) return openSignIn("");
    if (state.ws) {  // its requests end with it (the server cancels them)
      state.ws.onclose = null;
      state.ws.close(1000);
      state.ws = null;
      interruptPending("the connection to the server was replaced");
    }
    state.halted = false;
    state.welcome = null;
    const address = new URL(".", location.href);  // where the page is: also behind a proxy
    address.protocol = address.protocol === "https:" ? "wss:" : "ws:";
    const ws = new WebSocket(address.href);
    state.ws = ws;
    renderStatus();
    ws.onopen = () => {
      ws.opened = true;
      ws.send(JSON.stringify({ type: "hello", user: who.user, token: who.token || null }));
    };
    ws.onmessage = (event) => {
      let frame;
      try { frame = JSON.parse(event.data); } catch (e) { return; }
      if (frame && typeof frame === "object") onFrame(frame);
    };
    ws.onclose = (event) => onClose(ws, event);
  }

  function interruptPending(why) {
    for (const { chat, msg } of state.pending.values()) {
      msg.status = "interrupted";
      msg.error = why;
      touch(msg);
      saveChat(chat);
    }
    state.pending.clear();
  }

  function onClose(ws, event) {
    if (ws !== state.ws) return;
    state.ws = null;
    state.welcome = null;
    interruptPending("the connection to the server was lost");
    if (!state.halted) {
      let why = event.code === 1001 ? "the server went away (restarting?)"
        : event.reason ? `disconnected: ${event.reason}` : "cannot reach the server";
      if (!ws.opened && state.health?.ok) {  // it answers /healthz but refused the websocket
        why = "the server is up but refused this page's connection (open it by its IP address, " +
          "or see allowed_hosts in docs/protocol.md)";
      }
      const wait = state.retryMs;
      state.retryMs = Math.min(state.retryMs * 2, 10000);
      showNotice(`${why}; trying again in ${Math.round(wait / 1000)} s…`, true);
      state.reconnectTimer = setTimeout(connect, wait);
    }
    renderAll();
  }

  function send(frame) {
    if (!state.ws || state.ws.readyState !== WebSocket.OPEN) return false;
    state.ws.send(JSON.stringify(frame));
    return true;
  }

  function onFrame(frame) {
    const p = typeof frame.id === "string" ? state.pending.get(frame.id) : undefined;
    switch (frame.type) {
      case "welcome":
        state.welcome = frame;
        state.retryMs = 1000;
        const wasRemote = state.remote;
        state.remote = !!frame.conversations;
        state.listed = false;
        state.saving.clear();  // saves unanswered on the old connection: sent again
        if (state.trying) {  // a name the server accepted: now it is this page's
          const changed = state.trying.user !== state.identity?.user;
          state.identity = state.trying;
          state.trying = null;
          save("identity", state.identity);
          if (changed) state.chats = [];
          if (changed && !state.remote) loadChats();
        }
        if (state.remote) welcomeRemote();
        else if (wasRemote) loadChats();
        state.models = [];
        askModels();
        showNotice(quotaText(frame.quota));
        state.quotaNotice = !!frame.quota;
        if (frame.quota && frame.quota.remaining <= 0) blockUntil(Date.parse(frame.quota.resets_at));
        else unblock();
        renderAll();
        break;
      case "queued":
        if (p) {
          p.msg.status = "queued"; p.msg.position = frame.position;
          // the server's predicted wait, counted down here between its updates
          p.msg.entersAt = typeof frame.wait_s === "number" ? Date.now() + frame.wait_s * 1000 : null;
          countDown();
          p.msg.loading = frame.loading || "";  // its model loads first (several models)
          if (p.msg.loading) askModels();  // the picker shows it loading
          p.msg.requeued = !!p.msg.content; touch(p.msg);
        }
        break;
      case "token":
        if (p && typeof frame.text === "string") {
          if (typeof frame.reasoning === "string" && frame.reasoning) think(p.msg, frame.reasoning);
          if (frame.text && p.msg.thinkingSince) thought(p.msg);
          p.msg.content += frame.text;
          if (p.msg.status !== "stopping") p.msg.status = "streaming";
          touch(p.msg);
        }
        break;
      case "done":
        if (p) finish(frame.id, p, frame);
        break;
      case "models": onModels(frame); break;
      case "conversation_list": onListPage(frame); break;
      case "conversation": onFound(frame); break;
      case "conversation_saved": onSaved(frame); break;
      case "conversation_deleted":
        state.deleting.delete(frame.id);
        if (!frame.here) onDeleted(frame.id);
        else pushUnsaved();  // room again, maybe, for one the bound refused
        break;
      case "error":
        if (!p && state.remote && state.saving.has(frame.id) && frame.code === "conflict") {
          onConflict(frame);
        } else if (!p && state.remote && state.saving.has(frame.id)) {
          notSaved(frame);  // not_saved, or a frame the server could not take
        } else if (frame.code === "unknown_id" && !p && state.remote) {
          state.deleting.delete(frame.id);
          onDeleted(frame.id);  // asked for one this person no longer has
        } else if (frame.code === "unavailable" && !p && state.remote && frame.id) {
          notFound(frame);
        } else if (p && frame.code === "quota_exceeded") {
          quotaRefused(p.msg, String(frame.message || ""), frame.retry_after_s);
          finish(frame.id, p, null);
        } else if (p) {
          p.msg.error = errorText(frame);
          p.msg.status = "error";
          if (frame.code !== "internal") finish(frame.id, p, null);  // internal: a done follows
          else touch(p.msg);
        } else if (!state.welcome) {
          signInRefused(frame);
        } else {
          showNotice(`The server says: ${frame.message}`, true);
        }
        break;
      case "notice":
        showNotice(frame.code === "shutting_down"
          ? `The server is stopping (${frame.message}). This page reconnects when it is back.`
          : String(frame.message), true);
        break;
      default:  // stats and frames of later protocol versions
        break;
    }
  }

  function quotaText(quota) {  // where this person stands against a daily quota, if any
    if (!quota || typeof quota.daily_tokens !== "number") return null;
    const n = (x) => Number(x).toLocaleString("en");
    const resets = clock(Date.parse(quota.resets_at));
    return `Today: ${n(quota.used_today)} of your ${n(quota.daily_tokens)} tokens used, ` +
      `${n(quota.remaining)} left (resets at ${resets}).`;
  }

  function clock(at) {  // "HH:MM" in this browser's time, or "" for a time that is not one
    if (!Number.isFinite(at)) return "";
    const d = new Date(at);
    return `${String(d.getHours()).padStart(2, "0")}:${String(d.getMinutes()).padStart(2, "0")}`;
  }

  // A chat refused for the daily quota: said once, on the reply, no Retry (it would be refused
  // again) and the composer off until the reset, which the error's `retry_after_s` gives (in
  // seconds from now: it does not depend on this browser's clock being right). The message's
  // own "; it resets at ..." is left out: the composer shows the time.
  function quotaRefused(msg, message, retryAfterS) {
    const [why] = message.split("; it resets at ");
    // a second's margin: the server rounds it to a tenth, and the reset is on the minute
    const at = Number.isFinite(retryAfterS) ? Date.now() + retryAfterS * 1000 + 1000
      : Date.parse(state.welcome?.quota?.resets_at);
    msg.status = "error";
    msg.error = `Not sent: ${why}.`;
    if (state.quotaNotice) { showNotice(null); state.quotaNotice = false; }  // its "left" is stale
    blockUntil(at);
  }

  function blockUntil(at) {
    if (!Number.isFinite(at)) at = Date.now() + 3600000;  // no time given: try again in an hour
    state.quotaUntil = { at, shown: clock(Math.round(at / 60000) * 60000) };  // on the minute
    tick();
  }

  function unblock() {
    state.quotaUntil = null;
    clearTimeout(state.quotaTimer);
    state.quotaTimer = null;
    renderComposer();
  }

  function tick() {  // the countdown in the composer, once a minute, and the end of the block
    clearTimeout(state.quotaTimer);
    const left = state.quotaUntil ? state.quotaUntil.at - Date.now() : 0;
    if (left <= 0) return unblock();
    state.quotaTimer = setTimeout(tick, Math.min(60000, left));
    renderComposer();
  }

  const quotaBlocked = () => !!state.quotaUntil && Date.now() < state.quotaUntil.at;

  function errorText(frame) {
    const message = String(frame.message || "");
    switch (frame.code) {
      case "busy": return `The server is busy: ${message}. Try again in a moment.`;
      case "too_long": return `Too long for the model (${message}): shorten the message or start a new chat.`;
      case "shutting_down": return "The server is shutting down; try again when it is back.";
      case "internal": return `The server failed this reply: ${message}`;
      default: return `Refused (${frame.code}): ${message}`;
    }
  }

  function signInRefused(frame) {
    state.halted = true;
    if (state.ws) { state.ws.onclose = null; state.ws.close(1000); state.ws = null; }
    state.needsToken = state.needsToken || frame.code === "unauthorized";
    const tried = state.trying;
    state.trying = null;  // the refused name is not kept, nor its token
    openSignIn(frame.message || "refused", tried);
    renderStatus();
  }

  // A thinking model's reasoning comes before its answer, in the token frames' `reasoning`:
  // kept apart from the content (saved with the conversation, never sent back to the model),
  // timed from its first piece to the answer's first (in this page only: a reload says
  // "Reasoning").
  function think(msg, text) {
    if (!msg.reasoning) msg.thinkingSince = performance.now();
    msg.reasoning = (msg.reasoning || "") + text;
  }

  function thought(msg) {
    msg.thoughtMs = performance.now() - msg.thinkingSince;
    msg.thinkingSince = null;
  }

  function finish(id, p, done) {
    state.pending.delete(id);
    const msg = p.msg;
    if (msg.thinkingSince) thought(msg);  // all reasoning, no answer (or cut short)
    if (done) {
      msg.usage = done.usage;
      msg.timings = done.timings;
      msg.finish = done.finish_reason;
      msg.dropped = done.dropped_messages || 0;  // left out to fit the context (not kept)
      if (done.model) msg.model = done.model;  // the model that answered
      askModels();  // it is loaded now (and another maybe not)
      if (done.finish_reason === "error") msg.status = "error";
      else if (done.finish_reason !== "cancelled") msg.status = "done";
      else if (msg.status === "stopping") msg.status = "stopped";  // the person pressed Stop
      else {  // the server cut it short (it is stopping): as good as lost, offer a Retry
        msg.status = "interrupted";
        msg.error = "the server ended this reply early (it is stopping)";
      }
    }
    touch(msg);
    saveChat(p.chat);
    renderComposer();
  }

  // --- the model picker (a server with several models) ------------------------------------------
  // The server's models (its `models` frame: state, whether choosing one needs a swap, about how
  // long its load takes), asked for at each welcome, when the picker is opened, after each reply
  // and every MODELS_POLL_MS while a model loads. The open conversation's model (chat.model;
  // none: the server's default) is chosen here, kept with it and sent as its chats' `model`.

  function askModels() {
    if ((state.welcome?.models || []).length > 1) send({ type: "list_models" });
  }

  function onModels(frame) {
    state.models = Array.isArray(frame.models) ? frame.models : [];
    clearTimeout(state.modelsTimer);
    const waiting = [...state.pending.values()].some((p) => p.msg.loading);
    if (waiting || state.models.some((m) => m.state === "loading")) {
      state.modelsTimer = setTimeout(askModels, MODELS_POLL_MS);
    }
    renderPicker();
  }

  function chatModel(chat) {  // the model a conversation talks to
    return (chat && chat.model) || state.welcome?.model || "";
  }

  function modelLabel(name) {  // "gemma — loaded", "qwen — needs a swap (~7 s)"
    const m = state.models.find((x) => x.name === name);
    const dflt = name === state.welcome?.model ? " (default)" : "";
    if (!(state.welcome?.models || []).includes(name)) return `${name} — not on this server`;
    if (!m) return name + dflt;
    const secs = m.load_s != null ? ` (~${Math.max(1, Math.round(m.load_s))} s)` : "";
    let what = m.swap && m.swap.length ? `needs a swap${secs}` : `not loaded${secs}`;
    if (m.state === "loaded") what = m.busy ? "loaded, busy" : "loaded";
    else if (m.state === "loading") what = "loading…";
    else if (m.state === "failed") what = "failed";
    else if (m.too_big) what = "too big to load";
    return `${name}${dflt} — ${what}`;
  }

  function renderPicker() {
    const names = state.welcome?.models || [];
    const row = $("model-row");
    row.hidden = names.length <= 1;  // one model: nothing to pick
    if (row.hidden) return;
    const chat = currentChat();
    const chosen = chatModel(chat);
    const shown = names.includes(chosen) ? names : [...names, chosen];
    const labels = shown.map(modelLabel);
    const key = JSON.stringify([labels, chosen]);
    if (key !== state.modelsShown) {  // rebuilt only when it changed: an open list stays open
      state.modelsShown = key;
      const pick = $("model-pick");
      pick.replaceChildren(...shown.map((name, i) => {
        const option = document.createElement("option");
        option.value = name;
        option.textContent = labels[i];
        return option;
      }));
      pick.value = chosen;
    }
    const m = state.models.find((x) => x.name === chosen);
    row.dataset.state = m ? m.state : "";
    let note = "";
    if (m?.state === "failed") note = m.reason || "";
    else if (m?.state === "loading") note = m.reason || "loading…";
    else if (m?.state === "unloaded" && m.swap?.length) {
      note = `unloads ${m.swap.join(", ")}${m.swap_waits ? " once idle" : ""}`;
    }
    $("model-note").textContent = note;
    $("model-note").title = note;
  }

  function pickModel(name) {
    const chat = currentChat() || newChat();
    chat.model = name;
    if (chat.messages.length) saveChat(chat);  // else kept with its first message
    else renderMessages();  // the empty conversation names the model it will ask
    renderStatus();  // so does the status line
    renderPicker();
    askModels();
  }

  // --- chatting ---------------------------------------------------------------------------------

  function history(chat, upTo) {
    const turns = [];
    for (const m of chat.messages) {
      if (m === upTo) break;
      if (m.role === "user" || (m.content && ["done", "stopped"].includes(m.status))) {
        turns.push({ role: m.role, content: m.content });
      }
    }
    return turns;
  }

  function ask(chat, reply) {
    const id = `r${Date.now().toString(36)}${randomId(3)}`;
    Object.assign(reply, { id, status: "sending", content: "", error: null, position: null,
                           usage: null, timings: null, finish: null, reasoning: null,
                           thinkingSince: null, thoughtMs: null });
    const limits = state.welcome?.limits || {};
    const { temperature, max_tokens } = state.settings;
    const frame = { type: "chat", id, messages: history(chat, reply), temperature,
                    max_tokens: Math.min(max_tokens, limits.max_tokens || max_tokens) };
    if (chat.model) frame.model = chat.model;  // else the server's default
    const text = JSON.stringify(frame);
    const bytes = new TextEncoder().encode(text).length;
    if (limits.max_frame_bytes && bytes > limits.max_frame_bytes) {
      reply.status = "error";
      reply.error = `This conversation is too long to send (${Math.ceil(bytes / 1024)} KiB; ` +
        `the server takes ${Math.floor(limits.max_frame_bytes / 1024)} KiB). Start a new chat.`;
    } else if (state.ws && state.welcome && state.ws.readyState === WebSocket.OPEN) {
      state.pending.set(id, { chat, msg: reply });
      state.ws.send(text);
    } else {
      reply.status = "interrupted";
      reply.error = "not connected to the server";
    }
    saveChat(chat);
    renderMessages();
    renderComposer();
  }

  function submit() {
    const input = $("input");
    const text = input.value.trim();
    if (!text || !state.welcome || quotaBlocked()) return;
    const chat = currentChat() || newChat();
    if (replyInFlight(chat) || !chat.loaded) return;
    if (!chat.messages.length) chat.title = cut(text.split("\n")[0], 60);
    chat.messages.push({ role: "user", content: text });
    const reply = { role: "assistant", content: "" };
    chat.messages.push(reply);
    input.value = "";
    autoGrow();
    renderChats();
    ask(chat, reply);
  }

  function cancel(id) {
    const p = state.pending.get(id);
    if (!p) return;
    send({ type: "cancel", id });
    p.msg.status = "stopping";
    touch(p.msg);
  }

  function stop() {
    const msg = replyInFlight(currentChat());
    if (msg) cancel(msg.id);
  }

  function retry(chat, msg) {
    if (replyInFlight(chat) || chat.messages[chat.messages.length - 1] !== msg) return;
    if (quotaBlocked()) return;
    ask(chat, msg);
  }

  // --- rendering --------------------------------------------------------------------------------

  function renderAll() {
    renderPicker();
    renderStatus();
    renderChats();
    renderMessages();
    renderComposer();
  }

  function renderStatus() {
    const el = $("status");
    const h = state.health;
    const parts = [];
    let level = "ok";
    let why = "";
    if (h) {
      parts.push(chatModel(currentChat()) || h.model, h.backend);  // the model picked
      if (h.running !== undefined) parts.push(`${h.running} running`, `${h.waiting} waiting`);
      if (h.kv_total) parts.push(`KV ${Math.round(100 * (h.kv_used - (h.kv_cached || 0)) / h.kv_total)}%`);
      const kvShare = h.kv_total ? (h.kv_used - (h.kv_cached || 0)) / h.kv_total : 0;
      if (!h.ok) {  // the server says what is wrong: shutting down, the model, the record
        level = "down";
        const problem = h.problem || "shutting down";
        why = problem.length > 140 ? problem.slice(0, 139) + "…" : problem;
      }
      else if (h.waiting > 0) {
        level = "busy";
        if (kvShare >= 0.9) why = "busy: the KV cache is full";
        else if (h.max_running && h.running >= h.max_running) why = `busy: all ${h.max_running} places taken`;
        else why = "busy";
      }
    } else if (state.healthError) {
      level = "down";
      why = "server unreachable";
    }
    if (!state.welcome && !state.ws && !state.identity) {  // nobody has signed in yet
      level = level === "down" ? "down" : "idle";
      why = level === "down" ? why : "not signed in";
    } else if (!state.welcome) {
      level = level === "down" ? "down" : "busy";
      why = state.halted ? "signed out" : state.ws ? "connecting…" : why || "disconnected";
    }
    el.className = level;
    el.innerHTML = "";
    const dot = document.createElement("span");
    dot.className = "dot";
    const [model, backend, ...rest] = parts;  // the model picked: shown on a phone too
    const where = document.createElement("span");  // the backend: hidden on a phone
    where.className = "where";
    where.textContent = backend ? backend + (rest.length ? " · " : "") : "";
    el.append(dot, model ? model + (backend || rest.length ? " · " : "") : "", where,
              rest.join(" · "));
    el.title = parts.join(" · ");
    if (why) {
      const w = document.createElement("span");
      w.className = "why";
      w.textContent = `${parts.length ? " — " : ""}${why}`;
      el.append(w);
    }
    $("who").textContent = state.identity ? state.identity.user : "";
  }

  function renderChats() {
    const list = $("chat-list");
    list.innerHTML = "";
    for (const chat of state.chats) {
      const li = document.createElement("li");
      li.classList.toggle("current", chat.id === state.current);
      li.classList.toggle("unsaved", !!(state.remote && chat.unsaved));
      if (state.remote && chat.unsaved) li.title = "Not saved on the server yet";
      const open = document.createElement("button");
      open.type = "button";
      open.className = "open";
      open.textContent = chat.title || "New chat";
      open.title = chat.title || "";
      open.onclick = () => {
        state.current = chat.id;
        save(currentKey(), state.current);
        if (!chat.loaded) requestChat(chat);
        $("chats").classList.remove("open");
        renderAll();
      };
      const del = document.createElement("button");
      del.type = "button";
      del.className = "delete";
      del.textContent = "×";
      del.title = "Delete this conversation";
      del.setAttribute("aria-label", `Delete “${chat.title || "New chat"}”`);
      del.onclick = () => {  // two clicks: the first asks
        if (del.dataset.armed) return deleteChat(chat);
        del.dataset.armed = "1";
        del.textContent = "delete?";
        setTimeout(() => { delete del.dataset.armed; del.textContent = "×"; }, 3000);
      };
      li.append(open, del);
      list.append(li);
    }
  }

  function renderMessages() {
    const box = $("messages");
    box.innerHTML = "";
    const chat = currentChat();
    renderChatBar(chat);
    if (!chat || !chat.messages.length) {
      const empty = document.createElement("p");
      empty.className = "empty";
      const model = state.welcome ? ` ${chatModel(chat)}` : "";
      const where = state.remote ? "are kept on this server, for you only (on any device you " +
        "sign in from)" : "stay in this browser";
      empty.textContent = chat && !chat.loaded ? "Loading this conversation…"
        : `Ask${model} anything. Your conversations ${where}.`;
      box.append(empty);
      return;
    }
    for (const msg of chat.messages) {
      const el = document.createElement("article");
      el.className = `msg ${msg.role}`;
      el.innerHTML = '<div class="body"></div><div class="meta"></div>';
      state.nodes.set(msg, el);
      fill(msg, el, chat);
      box.append(el);
    }
    box.scrollTop = box.scrollHeight;
  }

  function renderChatBar(chat) {  // the open conversation's title, rename and export
    const bar = $("chat-bar");
    bar.hidden = !chat || !chat.messages.length;
    if (bar.hidden || bar.dataset.editing) return;
    $("chat-title").textContent = chat.title || "New chat";
    $("chat-title").title = chat.title || "";
  }

  function startRename() {
    const chat = currentChat();
    if (!chat) return;
    const bar = $("chat-bar");
    const input = $("chat-title-input");
    bar.dataset.editing = "1";
    $("chat-title").hidden = true;
    $("rename").hidden = true;
    input.hidden = false;
    input.value = chat.title || "";
    input.focus();
    input.select();
    const done = (keep) => {
      input.onkeydown = input.onblur = null;
      delete bar.dataset.editing;
      input.hidden = true;
      $("chat-title").hidden = false;
      $("rename").hidden = false;
      if (keep) renameChat(chat, input.value);
      renderChatBar(currentChat());
    };
    input.onkeydown = (e) => {
      if (e.key === "Enter") { e.preventDefault(); done(true); }
      else if (e.key === "Escape") { e.preventDefault(); done(false); }
    };
    input.onblur = () => done(true);
  }

  // "about 5 s", "about 2 min", "any moment now": a prediction, so rounded as a person would
  function aboutWait(leftMs) {
    const s = Math.round(leftMs / 1000);
    if (s <= 0) return "any moment now";
    if (s < 60) return `about ${s} s`;
    return `about ${Math.round(s / 60)} min`;
  }

  // Once a second while a reply waits with a predicted wait: its countdown is rendered again.
  function countDown() {
    if (state.countdownTimer) return;
    const tick = () => {
      const waiting = [...state.pending.values()].map((p) => p.msg)
        .filter((m) => m.status === "queued" && m.entersAt);
      waiting.forEach(touch);
      state.countdownTimer = waiting.length ? setTimeout(tick, 1000) : null;
    };
    state.countdownTimer = setTimeout(tick, 1000);
  }

  function touch(msg) {
    state.dirty.add(msg);
    if (!state.renderTimer) state.renderTimer = setTimeout(flush, state.renderEvery);
  }

  function flush() {
    const started = performance.now();
    state.renderTimer = null;
    const box = $("messages");
    const atBottom = box.scrollHeight - box.scrollTop - box.clientHeight < 40;
    const chat = currentChat();
    for (const msg of state.dirty) {
      const el = state.nodes.get(msg);
      if (el && el.isConnected) fill(msg, el, chat);
    }
    state.dirty.clear();
    if (atBottom) box.scrollTop = box.scrollHeight;
    renderComposer();
    // each render parses the whole reply again: a long one (or a slow phone) renders less
    // often, so rendering never takes more than about a third of the time
    state.renderEvery = Math.max(RENDER_EVERY_MS, 2 * (performance.now() - started));
  }

  function fill(msg, el, chat) {
    const body = el.querySelector(".body");
    const meta = el.querySelector(".meta");
    el.dataset.status = msg.status || "";
    if (msg.role === "user") {
      body.textContent = msg.content;
      return;
    }
    if (markdown) body.replaceChildren(markdown(msg.content));
    else body.textContent = msg.content;
    const coming = msg.status === "streaming" || msg.status === "sending";
    const thinking = fillReasoning(msg, el, body, coming);
    body.classList.toggle("cursor", coming && !thinking);
    meta.innerHTML = "";
    const add = (text, cls) => {
      const span = document.createElement("span");
      span.textContent = text;
      if (cls) span.className = cls;
      meta.append(span);
      return span;
    };
    switch (msg.status) {
      case "sending": add("sending…", "waiting"); break;
      case "queued":
        if (msg.loading) { add(`${msg.loading}…`, "waiting loading"); break; }
        add(`${msg.requeued ? "paused for others, waiting again" : "waiting"} · ` +
            `${ordinal(msg.position || 1)} in line`, "waiting position");
        if (msg.entersAt) add(aboutWait(msg.entersAt - Date.now()), "waiting countdown");
        break;
      case "stopping": add("stopping…", "stopped"); break;
      case "error": case "interrupted":
        add(msg.error || "failed", "error");
        if (chat && chat.messages[chat.messages.length - 1] === msg && !quotaBlocked()) {
          const again = document.createElement("button");
          again.type = "button";
          again.className = "retry";
          again.textContent = "Retry";
          again.onclick = () => retry(chat, msg);
          meta.append(again);
        }
        break;
      default: break;
    }
    if (msg.model && (state.welcome?.models || []).length > 1) add(msg.model, "model");
    if (msg.timings && msg.usage) {
      const t = msg.timings;
      const u = msg.usage;
      if (msg.status === "stopped") add("stopped", "stopped");
      if (msg.finish === "length") add("cut at the length limit", "stopped");
      add(`TTFT ${ms(t.ttft_ms)}`, "ttft");
      if (t.itl_ms) add(`ITL ${ms(t.itl_ms)}`, "itl");
      if (t.itl_ms) add(`${(1000 / t.itl_ms).toFixed(1)} tok/s`, "rate");
      add(`${u.completion_tokens} tokens`);
      if (t.load_ms) add(`model loaded ${ms(t.load_ms)}`, "load");
      if (t.queue_ms > 50) add(`queued ${ms(t.queue_ms)}`);
      add(`prompt ${u.prompt_tokens} (${u.cached_tokens} cached)`);
    }
    if (msg.dropped) {
      const oldest = msg.dropped === 1 ? "oldest message was" : `${msg.dropped} oldest messages were`;
      add(`the ${oldest} left out: the chat is longer than the model's context`, "dropped");
    }
  }

  // The reply's reasoning, folded above its answer (<details class="reasoning">), as plain text
  // (it is model text): open while it streams, closed once the answer starts (the person may
  // open it again). Returns whether the model is thinking still.
  function fillReasoning(msg, el, body, coming) {
    let box = el.querySelector("details.reasoning");
    if (!msg.reasoning) {
      if (box) box.remove();
      return false;
    }
    if (!box) {
      box = document.createElement("details");
      box.className = "reasoning";
      box.append(document.createElement("summary"), document.createElement("div"));
      box.lastChild.className = "text";
      el.insertBefore(box, body);
    }
    const thinking = coming && !msg.content;
    box.querySelector("summary").textContent = thinking ? "Thinking…"
      : Number.isFinite(msg.thoughtMs) ? `Thought for ${ms(msg.thoughtMs)}` : "Reasoning";
    const text = box.querySelector(".text");
    text.textContent = msg.reasoning;
    text.classList.toggle("cursor", thinking);
    if (box.thinking !== thinking) box.open = thinking;  // only when it changes: the person's
    box.thinking = thinking;                              // own opening stays
    return thinking;
  }

  function quotaWait() {  // the composer's text while the quota is used up
    const mins = Math.ceil((state.quotaUntil.at - Date.now()) / 60000);
    const left = mins >= 60 ? `${Math.floor(mins / 60)} h ${String(mins % 60).padStart(2, "0")} min`
      : `${mins} min`;
    return `You can send again at ${state.quotaUntil.shown} (in ${left}), when your daily quota resets.`;
  }

  function renderComposer() {
    const chat = currentChat();
    const inFlight = chat ? replyInFlight(chat) : null;
    const blocked = quotaBlocked();
    const ready = !!state.welcome && !blocked && (!chat || chat.loaded);
    $("input").disabled = !ready;
    $("input").placeholder = blocked ? quotaWait() : PLACEHOLDER;
    $("send").disabled = !ready || !!inFlight;
    $("send").hidden = !!inFlight;
    $("stop").hidden = !inFlight;
    $("stop").disabled = !!inFlight && inFlight.status === "stopping";
  }

  function showNotice(text, bad) {
    const el = $("notice");
    el.hidden = !text;
    el.textContent = text || "";
    el.classList.toggle("bad", !!bad);
  }

  function autoGrow() {
    const input = $("input");
    input.style.height = "auto";
    input.style.height = `${Math.min(input.scrollHeight + 2, window.innerHeight * 0.4)}px`;
  }

  // --- signing in -------------------------------------------------------------------------------

  function openSignIn(why, tried) {
    const dialog = $("signin");
    const shown = tried || state.identity;
    $("signin-why").textContent = why || "";
    $("signin-user").value = shown?.user || "";
    $("signin-token").value = shown?.token || "";
    // an open server (no users, no tokens) needs none; unknown (unreachable): ask anyway
    $("signin-token-row").hidden = !!state.health && !state.health.tokens && !state.needsToken;
    if (!dialog.open) dialog.showModal();
    $("signin-user").focus();
  }

  function signIn(event) {
    event.preventDefault();
    const user = $("signin-user").value.trim();
    if (!user) return;
    const token = $("signin-token").value || null;
    $("signin").close();
    const same = state.identity && user === state.identity.user && token === state.identity.token;
    if (same && state.welcome) return;  // nothing changed: the connection goes on
    connect({ user, token });
  }

  function openSettings() {
    $("set-temperature").value = state.settings.temperature;
    const input = $("set-max-tokens");
    input.max = state.welcome?.limits?.max_tokens || "";
    input.value = state.settings.max_tokens;
    $("settings").showModal();
  }

  function saveSettings(event) {
    event.preventDefault();
    const temperature = Number($("set-temperature").value);
    const maxTokens = Number($("set-max-tokens").value);
    if (Number.isFinite(temperature) && temperature >= 0 && temperature <= 2) {
      state.settings.temperature = temperature;
    }
    if (Number.isInteger(maxTokens) && maxTokens >= 1) state.settings.max_tokens = maxTokens;
    save("settings", state.settings);
    $("settings").close();
  }

  // --- the server's state -----------------------------------------------------------------------

  async function pollHealth() {
    try {
      const response = await fetch("healthz", { cache: "no-store" });
      state.health = await response.json();
      state.healthError = null;
    } catch (e) {
      state.health = null;
      state.healthError = String(e);
    }
    renderStatus();
    setTimeout(pollHealth, document.hidden ? HEALTH_HIDDEN_MS : HEALTH_EVERY_MS);
  }

  // --- start ------------------------------------------------------------------------------------

  function start() {
    setUpMarkdown();
    loadIdentity();
    loadChats();
    $("composer").addEventListener("submit", (e) => { e.preventDefault(); submit(); });
    $("input").addEventListener("keydown", (e) => {
      if (e.key === "Enter" && !e.shiftKey && !e.isComposing) { e.preventDefault(); submit(); }
      else if (e.key === "Escape") stop();
    });
    $("input").addEventListener("input", autoGrow);
    $("stop").addEventListener("click", stop);
    $("model-pick").addEventListener("change", () => pickModel($("model-pick").value));
    for (const opened of ["focus", "mousedown", "touchstart"]) {  // fresh states when opened
      $("model-pick").addEventListener(opened, askModels, { passive: true });
    }
    $("new-chat").addEventListener("click", () => { newChat(); $("chats").classList.remove("open"); });
    $("who").addEventListener("click", () => openSignIn(""));
    $("settings-open").addEventListener("click", openSettings);
    $("rename").addEventListener("click", startRename);
    $("export-md").addEventListener("click", () => exportChat("md"));
    $("export-json").addEventListener("click", () => exportChat("json"));
    $("settings-form").addEventListener("submit", saveSettings);
    $("signin-form").addEventListener("submit", signIn);
    $("signin").addEventListener("cancel", (e) => {  // Escape: only back to a live connection
      if (!state.welcome) e.preventDefault();
    });
    window.addEventListener("storage", onStorage);
    $("chats-toggle").addEventListener("click", () => {
      const open = $("chats").classList.toggle("open");
      $("chats-toggle").setAttribute("aria-expanded", String(open));
    });
    renderAll();
    pollHealth().then(() => {
      if (state.identity) connect();
      else openSignIn("");
    });
  }

  start();
})();
