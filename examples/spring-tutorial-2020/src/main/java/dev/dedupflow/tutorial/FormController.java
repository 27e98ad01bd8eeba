package dev.dedupflow.tutorial;

import org.springframework.http.MediaType;
import org.springframework.web.bind.annotation.GetMapping;
import org.springframework.web.bind.annotation.PostMapping;
import org.springframework.web.bind.annotation.RequestParam;
import org.springframework.web.bind.annotation.RestController;
import org.springframework.web.util.HtmlUtils;

/** The page a reader opens: one form, a message and its key. */
@RestController
class FormController {
  private static final String FORM = String.join("\n",
      "<!doctype html>",
      "<title>dedupflow: the tutorial's app</title>",
      "<h1>Send a message to topicToDataflow</h1>",
      "%s",
      "<form method=\"post\" action=\"/\">",
      "  <label>Message <input name=\"message\" required></label>",
      "  <label>Key <input name=\"key\"></label>",
      "  <button>Send</button>",
      "</form>",
      "<p>Messages that come back from topicFromDataflow are printed on the app's console.</p>");

  private final App.Outbox outbox;

  FormController(App.Outbox outbox) {
    this.outbox = outbox;
  }

  @GetMapping(value = "/", produces = MediaType.TEXT_HTML_VALUE)
  String form() {
    return String.format(FORM, "");
  }

  @PostMapping(value = "/", produces = MediaType.TEXT_HTML_VALUE)
  String send(@RequestParam String message, @RequestParam(defaultValue = "") String key) {
    outbox.send(message, key);
    String sent = "<p>Sent \"" + HtmlUtils.htmlEscape(message) + "\" with key \""
        + HtmlUtils.htmlEscape(key) + "\".</p>";
    return String.format(FORM, sent);
  }
}
