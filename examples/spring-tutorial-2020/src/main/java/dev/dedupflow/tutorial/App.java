package dev.dedupflow.tutorial;

import java.util.function.Consumer;
import java.util.function.Supplier;

import org.springframework.boot.SpringApplication;
import org.springframework.boot.autoconfigure.SpringBootApplication;
import org.springframework.context.annotation.Bean;
import org.springframework.messaging.Message;
import org.springframework.messaging.support.MessageBuilder;
import org.springframework.stereotype.Component;

import reactor.core.publisher.EmitterProcessor;
import reactor.core.publisher.Flux;
import reactor.core.publisher.FluxSink;

/**
 * The tutorial's app on Spring Boot 2.2: the form's messages go to Pub/Sub
 * through a Supplier binding, and what comes back is printed by a Consumer
 * binding. Reactor 3.3 has no Sinks, so an EmitterProcessor feeds the Flux.
 */
@SpringBootApplication
public class App {
  public static void main(String[] args) {
    SpringApplication.run(App.class, args);
  }

  /** The form hands each message to this processor; the Supplier's Flux is it. */
  @Component
  static class Outbox {
    private final EmitterProcessor<Message<String>> processor = EmitterProcessor.create();
    private final FluxSink<Message<String>> sink = processor.sink(); // serializes concurrent posts

    /** Queues data with its key as header "key", which the binder turns into an attribute. */
    void send(String data, String key) {
      MessageBuilder<String> b = MessageBuilder.withPayload(data);
      if (key != null && !key.isEmpty()) {
        b.setHeader("key", key);
      }
      sink.next(b.build());
    }

    Flux<Message<String>> flux() {
      return processor;
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
