package dev.dedupflow.beamref;

import org.apache.beam.sdk.Pipeline;
import org.apache.beam.sdk.io.gcp.pubsub.PubsubIO;
import org.apache.beam.sdk.io.gcp.pubsub.PubsubOptions;
import org.apache.beam.sdk.options.Description;
import org.apache.beam.sdk.options.PipelineOptionsFactory;
import org.apache.beam.sdk.options.Validation;

/**
 * The tutorial's Dataflow job: read a topic, drop messages whose id attribute
 * was seen before (Beam's own withIdAttribute), write the rest to another
 * topic. dedupflow's tests run it on the DirectRunner beside `dedupflow
 * pipeline` and compare what the two write.
 */
public final class TutorialJob {
  /** The tutorial's options, plus the timestamp attribute Beam reads event times from. */
  public interface Options extends PubsubOptions {
    @Description("Topic to read, projects/P/topics/T (the job makes its own subscription)")
    String getInputTopic();

    void setInputTopic(String value);

    @Description("Subscription to read instead of a topic, projects/P/subscriptions/S")
    String getInputSubscription();

    void setInputSubscription(String value);

    @Description("Topic to write, projects/P/topics/T")
    @Validation.Required
    String getOutputTopic();

    void setOutputTopic(String value);

    @Description("Attribute whose value identifies a message; repeats are dropped")
    @Validation.Required
    String getIdAttribute();

    void setIdAttribute(String value);

    @Description("Attribute holding the event time (milliseconds or RFC 3339); empty: publish time")
    String getTimestampAttribute();

    void setTimestampAttribute(String value);
  }

  private TutorialJob() {}

  public static void main(String[] args) {
    Options options = PipelineOptionsFactory.fromArgs(args).withValidation().as(Options.class);
    options.setStreaming(true);
    Pipeline p = Pipeline.create(options);
    PubsubIO.Read<String> read = PubsubIO.readStrings().withIdAttribute(options.getIdAttribute());
    String sub = options.getInputSubscription();
    if (sub != null && !sub.isEmpty()) {
      read = read.fromSubscription(sub);
    } else if (options.getInputTopic() != null && !options.getInputTopic().isEmpty()) {
      read = read.fromTopic(options.getInputTopic());
    } else {
      throw new IllegalArgumentException("give --inputTopic or --inputSubscription");
    }
    String ts = options.getTimestampAttribute();
    if (ts != null && !ts.isEmpty()) {
      read = read.withTimestampAttribute(ts);
    }
    p.apply("Read", read).apply("Write", PubsubIO.writeStrings().to(options.getOutputTopic()));
    p.run().waitUntilFinish();
  }
}
