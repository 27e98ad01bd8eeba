package dev.dedupflow.tutorial;

import java.time.Duration;
import java.util.function.Consumer;
import java.util.function.Supplier;

import org.springframework.boot.SpringApplication;
import org.springframework.boot.autoconfigure.SpringBootApplication;
import org.springframework.context.annotation.Bean;
import org.springframework.messaging.Message;
import org.springframework.messaging.support.MessageBuilder;
import org.springframework.stereotype.Component;

import reactor.core.publisher.Flux;
import reactor.core.publisher.Sinks;

/**
 * The tutorial's app: messages typed into the web form go to Pub/Sub through
 * a Supplier binding, and the deduplicated stream that comes back is printed
 * by a Consumer binding. Topics and subscriptions are created by the binder.
 */
@SpringBootApplication
public class App {
  public static void main(String[] args) {
    SpringApplication.run(App.class, args);
  }

  /** The form hands each message to this queue; the Supplier's Flux drains it. */
  @Component
  static class Outbox {
    private final Sinks.Many<Message<String>> sink = Sinks.many().unicast().onBackpressureBuffer();

    /** Queues data with its key as header "key", which the binder turns into an attribute. */
    void send(String data, String key) {
      MessageBuilder<String> b = MessageBuilder.withPayload(data);
      if (key != null && !key.isEmpty()) {
        b.setHeader("key", key);
      }
      // Form posts arrive on several Tomcat threads; the sink takes one at a time.
      sink.emitNext(b.build(), Sinks.EmitFailureHandler.busyLooping(Duration.ofSeconds(2)));
    }

    Flux<Message<String>> flux() {
      return sink.asFlux();
    }
  }

  /** Bound to topicToDataflow (binding toDataflow-out-0). */
  @Bean
  Supplier<Flux<Message<String>>> toDataflow(Outbox outbox) {
    return outbox::flux;
  }

  /** Bound to topicFromDataflow, subscription topicFromDataflow.subscriptionFromDataflow. */
  @Bean
  Consumer<Message<String>> fromDataflow() {
    return msg -> {
      Object key = msg.getHeaders().get("key");
      System.out.println("received \"" + msg.getPayload() + "\" key=" + (key == null ? "" : key));
      System.out.flush();
    };
  }
}
