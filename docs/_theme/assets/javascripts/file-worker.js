// Material's search runs in a Web Worker, and a browser starts no worker from a file://
// page. There (and only there) this stands in for Worker: the worker's script runs in a
// hidden frame of the page, and the messages each side posts reach the other as
// "message" events, cloned as a worker's would be.
(function () {
  "use strict";
  if (location.protocol !== "file:") {
    return;
  }

  function load(win, src) {
    return new Promise(function (resolve, reject) {
      var script = win.document.createElement("script");
      script.src = src;
      script.onload = resolve;
      script.onerror = function () {
        reject(new Error("cannot load " + src));
      };
      win.document.head.appendChild(script);
    });
  }

  class FileWorker extends EventTarget {
    constructor(url) {
      super();
      this.onmessage = null;
      this.onerror = null;
      this.url = new URL(url, location.href).href;
      this.pending = [];
      this.frame = document.createElement("iframe");
      this.frame.hidden = true;
      this.frame.setAttribute("aria-hidden", "true");
      if (document.body) {
        this.start();
      } else {
        document.addEventListener("DOMContentLoaded", () => this.start());
      }
    }

    start() {
      document.body.appendChild(this.frame);
      var win = this.frame.contentWindow;
      var self = this;
      // What the worker's script calls as globals, in the frame's window.
      win.postMessage = function (data) {
        setTimeout(function () {
          self.deliver(structuredClone(data));
        });
      };
      win.importScripts = function () {
        var urls = Array.from(arguments);
        return urls.reduce(function (done, u) {
          return done.then(function () {
            return load(win, new URL(u, self.url).href);
          });
        }, Promise.resolve());
      };
      load(win, this.url).then(
        function () {
          self.win = win;
          self.pending.splice(0).forEach(function (data) {
            self.postMessage(data);
          });
        },
        function (error) {
          var event = new ErrorEvent("error", { message: error.message });
          if (self.onerror) {
            self.onerror(event);
          }
          self.dispatchEvent(event);
        }
      );
    }

    deliver(data) {
      var event = new MessageEvent("message", { data: data });
      if (this.onmessage) {
        this.onmessage(event);
      }
      this.dispatchEvent(event);
    }

    postMessage(data) {
      if (!this.win) {
        this.pending.push(data);
        return;
      }
      var win = this.win;
      var copy = win.structuredClone(data); // objects of the frame's own realm
      setTimeout(function () {
        win.dispatchEvent(new win.MessageEvent("message", { data: copy }));
      });
    }

    terminate() {
      this.frame.remove();
      this.win = null;
    }
  }

  window.Worker = FileWorker;
})();
